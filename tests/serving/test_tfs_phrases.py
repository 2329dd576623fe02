"""Each of tfship's bounded messages for a fault TF Serving also refuses contains TF Serving's phrase for it, so
scripts that grep for the phrase keep working (issue 32). Sources: tensorflow/serving snapshot 9d981c5c,
`predict_util.cc` = tensorflow_serving/servables/tensorflow/predict_util.cc (phrases pinned by its
predict_util_test.cc), `json_tensor.cc` = tensorflow_serving/util/json_tensor.cc. TensorFlow's own phrase for a
fed dtype that differs from the placeholder's is `Expects arg[i] to be float but double is provided`.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfship.core.contract import Signature, TensorSpec
from tfship.core.errors import InvalidRequestError
from tfship.serving.dataplane.answer_checks import check_output_filter
from tfship.serving.dataplane.contract import validate_inputs
from tfship.serving.tfs.rest_json import parse_body, request_inputs

SIGNATURE = Signature("serving_default", inputs={"x": TensorSpec("float32", (None, 2)), "k": TensorSpec("int64", (None,))},
                      outputs={"y": TensorSpec("float32", (None, 2)), "z": TensorSpec("float32", (None,))})
GOOD = {"x": np.ones((1, 2), np.float32), "k": np.ones((1,), np.int64)}


def _message(call) -> str:
    with pytest.raises(InvalidRequestError) as err:
        call()
    assert len(str(err.value)) < 2100  # bounded
    return str(err.value)


def test_missing_and_extra_inputs():
    """predict_util.cc VerifyRequestInputsSize (:51-74): `input size does not match signature: 1!=2 len({x}) !=
    len({k,x}). Sent extra: {}. Missing but required: {k}.` (predict_util_test.cc :246-251)."""
    message = _message(lambda: validate_inputs(SIGNATURE, {"x": GOOD["x"]}))
    assert "input size does not match signature: 1!=2 len({x}) != len({k,x}). Sent extra: {}. " \
           "Missing but required: {k}." in message and "missing input(s) ['k']" in message
    extra = {**GOOD, "unknown_key1": np.ones(1), "unknown_key2": np.ones(1)}
    message = _message(lambda: validate_inputs(SIGNATURE, extra))
    assert "Sent extra: {unknown_key1,unknown_key2}" in message
    many = {**GOOD, **{f"k{i}" * 30: np.ones(1) for i in range(50)}}  # client-sent names stay bounded
    assert ",..." in _message(lambda: validate_inputs(SIGNATURE, many))


def test_wrong_dtype():
    """TensorFlow's `Expects arg[0] to be float but double is provided` (predict_util_test.cc :271, :329)."""
    message = _message(lambda: validate_inputs(SIGNATURE, {**GOOD, "x": GOOD["x"].astype(np.float64)}, False))
    assert "to be float but double is provided" in message and "expected dtype float32" in message
    message = _message(lambda: validate_inputs(SIGNATURE, {**GOOD, "k": np.ones(1, bool)}, False))
    assert "to be int64 but bool is provided" in message


def test_output_filter():
    """predict_util.cc PreProcessPrediction (:138-149): `output tensor alias not found in signature: w Outputs
    expected to be in the set {y,z}.` and `duplicate output tensor alias: y` (predict_util_test.cc :294, :306)."""
    assert "output tensor alias not found in signature: w Outputs expected to be in the set {y,z}." in _message(
        lambda: check_output_filter(SIGNATURE, ("y", "w")))
    assert "duplicate output tensor alias: y" in _message(lambda: check_output_filter(SIGNATURE, ("y", "z", "y")))
    check_output_filter(SIGNATURE, ("z", "y"))  # a good filter passes


@pytest.mark.parametrize(("body", "phrase"), [
    (b"", "JSON Parse error: The document is empty"),  # json_tensor.cc:475
    (b'{"inputs": {"x": [[1.0, 2.0]]}}', "Missing named input: k in 'inputs' object."),  # json_tensor.cc:635
    (b'{"instances": [{"x": [1.0, 2.0], "k": 1}, {"x": [1.0, 2.0, 3.0], "k": 1}]}',
     "Expecting tensor size: 2 but got: 3"),  # json_tensor.cc:463
    (b'{"instances": [{"x": [1.0, 2.0], "k": 1}, {"x": [[1.0, 2.0]], "k": 1}]}',
     "Expecting shape [2] but got: [1,2]"),  # json_tensor.cc:467
    (b'{"instances": [{"x": [1.0, 2.0]}]}', "keys must be equal to: k,x"),  # json_tensor.cc:568
    (b'{"instances": [{"x": [1.0, 2.0], "k": 1.5}]}', "Type: Number is not of expected type: int64"),  # :317
    (b'{"instances": []}', "No values in 'instances' array"),  # json_tensor.cc:687
    (b'{"instances": [1], "inputs": [1]}', "Not formatted correctly expecting only one of 'inputs' or 'instances'"),
    (b'{"x": 1}', "Missing 'inputs' or 'instances' key"),  # json_tensor.cc:704
])
def test_rest_json_phrases(body, phrase):
    def call():
        request_inputs(parse_body(body), SIGNATURE)

    assert phrase in _message(call)


def test_well_formed_bodies_pass():
    arrays, rows = request_inputs(parse_body(b'{"instances": [{"x": [1.0, 2.0], "k": 1}]}'), SIGNATURE)
    assert rows and arrays["x"].shape == (1, 2) and arrays["k"].tolist() == [1]
    validate_inputs(SIGNATURE, GOOD)

"""TF Serving's REST JSON rules, each pinned to the line of tensorflow/serving that fixes it (snapshot 9d981c5c;
`json_tensor.cc` = tensorflow_serving/util/json_tensor.cc, `json_tensor_test.cc` beside it). Where tfship differs
on purpose the test says so and why (docs/tf-serving.md lists every difference). No server: the decoders and the
writer are called directly; test_tfs_rest_docs.py drives the same rules through a real server.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tfship.core.contract import Signature, TensorSpec
from tfship.core.errors import InvalidRequestError
from tfship.serving.tfs.json_write import decimal_texts, dumps, response_json
from tfship.serving.tfs.rest_json import b64_decode, parse_body, request_inputs

ONE = Signature("one", inputs={"x": TensorSpec("float32", (None,))}, outputs={})
TWO = Signature("two", inputs={"a": TensorSpec("int32", (None, 2)), "b": TensorSpec("string", (None,))}, outputs={})


def _refused(body: dict, signature: Signature = ONE) -> str:
    with pytest.raises(InvalidRequestError) as err:
        request_inputs(body, signature)
    return str(err.value)


# ------------------------------------------------------------------------------------------------ number writing
@pytest.mark.parametrize(("values", "dtype", "texts"), [
    # json_tensor_test.cc FromJsonSingleFloatTensorSixDigitPrecision (:924): %g's six digits, '.0' on whole numbers
    ([9000000, 999999, 0.5, 0.0003, 0.00003, 555557.5], np.float32,
     ["9e+06", "999999.0", "0.5", "0.0003", "3e-05", "555557.5"]),
    # json_tensor_test.cc FromJsonSingleFloatTensorNonFinite (:951)
    ([np.nan, np.inf, 3, -np.inf], np.float32, ["NaN", "Infinity", "3.0", "-Infinity"]),
    # json_tensor.cc WriteDecimal (:125-167): %g does not read back to the float -> %.9g (max_digits10 of float)
    ([1435774300.0, 0.2, 123456789], np.float32, ["1.43577434e+09", "0.2", "123456792.0"]),
    # ... and %.17g for a double
    ([1435774300.0, 1 / 3, 0.1 + 0.2, 4.0], np.float64,
     ["1435774300.0", "0.33333333333333331", "0.30000000000000004", "4.0"]),
])
def test_floats_are_written_as_tf_serving_writes_them(values, dtype, texts):
    assert decimal_texts(np.array(values, dtype)).tolist() == texts
    # and each text reads back to the value written (the rule's purpose), in the value's own type
    for text, value in zip(texts, np.array(values, dtype)):
        if np.isfinite(value):
            assert dtype(float(text)) == value


def test_the_issue_example_in_a_predict_answer():
    """Issue 32: float32 1435774300 was written `1435774300.0`; TF Serving writes `1.43577434e+09`."""
    text = dumps(response_json({"y": np.array([[1435774300.0]], np.float32)}, rows=True))
    assert text == '{"predictions":[[1.43577434e+09]]}'
    assert np.float32(json.loads(text)["predictions"][0][0]) == np.float32(1435774300.0)  # reads back the same


def test_zero_batch_answers_are_empty_predictions():
    """json_tensor_test.cc FromJsonSingleZeroBatchTensor / FromJsonMultipleZeroBatchTensors (:1153, :1170)."""
    one = {"t": np.zeros((0, 2), np.int32)}
    two = {"s": np.zeros((0, 1, 2), object), "f": np.zeros((0, 3, 4), np.float32)}
    assert json.loads(dumps(response_json(one, rows=True))) == {"predictions": []}
    assert json.loads(dumps(response_json(two, rows=True))) == {"predictions": []}


# ------------------------------------------------------------------------------------------------ parser rules
def test_inputs_object_reads_only_the_signatures_names():
    """json_tensor.cc FillTensorMapFromInputsMap (:609-648) loops over the signature's inputs: other keys are
    ignored; a missing one is `Missing named input: <name> in 'inputs' object.` (:635)."""
    arrays, rows = request_inputs({"inputs": {"a": [[1, 2]], "b": ["s"], "extra": {"any": [1]}}}, TWO)
    assert sorted(arrays) == ["a", "b"] and not rows
    message = _refused({"inputs": {"a": [[1, 2]], "bb": ["s"]}}, TWO)
    assert message.startswith("Missing named input: b in 'inputs' object.") and "'bb'" in message


def test_instances_objects_must_carry_exactly_the_signatures_names():
    """json_tensor.cc FillTensorMapFromInstancesList (:519-605): an unknown key fails in AddInstanceItem (`does not
    have named input`, :449); keys that differ from the signature's are `keys must be equal to: a,b` (:568)."""
    message = _refused({"instances": [{"a": [1, 2], "b": "s", "c": 1}]}, TWO)
    assert "key: c of 'instances' list" in message and "does not have named input: c" in message
    message = _refused({"instances": [{"a": [1, 2]}]}, TWO)
    assert "Failed to process element: 0 of 'instances' list." in message and "keys must be equal to: a,b" in message


@pytest.mark.parametrize(("instances", "phrase"), [
    # json_tensor_test.cc SingleUnnamedTensorErrors (:642): the three instance-mismatch bodies and their phrases
    ([[1, 2], [3, 4], [5, 6, 7]], "Expecting tensor size: 2 but got: 3"),
    ([[1, 2], [3, 4], [[5, 6]]], "Expecting shape [2] but got: [1,2]"),
    ([1, [1]], "Expecting shape [] but got: [1]"),
])
def test_instances_of_different_sizes_or_shapes(instances, phrase):
    """json_tensor.cc AddInstanceItem (:463, :467)."""
    message = _refused({"instances": instances})
    assert phrase in message and "Failed to process element:" in message and "'x'" in message


@pytest.mark.parametrize("raw", [b"", b"   \n"])
def test_empty_document(raw):
    """json_tensor.cc ParseJson (:475): `JSON Parse error: The document is empty`."""
    with pytest.raises(InvalidRequestError, match="^JSON Parse error: The document is empty"):
        parse_body(raw)


def test_trailing_bytes_after_the_document_are_refused():
    """Difference (safer): TF Serving parses with kParseStopWhenDoneFlag (json_tensor.cc:485) and ignores what
    follows the first document, so `{...} {...}` silently drops the second; tfship refuses it (400). Trailing
    whitespace is accepted by both."""
    assert parse_body(b'{"instances": [1.0]}  \n\t') == {"instances": [1.0]}
    with pytest.raises(InvalidRequestError, match="JSON Parse error: .* at offset: 21"):
        parse_body(b'{"instances": [1.0]} {"instances": [2.0]}')


def test_nesting_depth():
    """TF Serving parses iteratively (kParseIterativeFlag, json_tensor.cc:483): json_tensor_test.cc
    DeeplyNestedWellFormed (:87) nests an ignored key 500,000 deep and is answered. tfship ignores such a key
    too up to 1,024 levels; difference (bounded): its parsers (orjson, then Python's json) stop at 1,024 levels,
    so deeper bodies, the test's 500,000 levels included, are 400 `nested too deeply` (never a crash), and a
    tensor has at most 64 dims (numpy's rank limit, where TensorFlow's is 254)."""
    deep = b"[" * 1000 + b"]" * 1000
    body = parse_body(b'{"instances": [1.0], "nested": ' + deep + b"}")
    assert request_inputs(body, ONE)[0]["x"].tolist() == [1.0]
    with pytest.raises(InvalidRequestError, match="nested too deeply"):
        parse_body(b'{"instances": [1.0], "nested": ' + b"[" * 1025 + b"]" * 1025 + b"}")
    with pytest.raises(InvalidRequestError, match="nested too deeply"):
        parse_body(b'{"instances": [1.0], "nested": ' + b"[" * 500000 + b"]" * 500000 + b"}")
    assert "at most 64 dims" in _refused({"inputs": json.loads("[" * 70 + "1.0" + "]" * 70)})


def test_zero_length_instances():
    """json_tensor.cc FillPredictRequestFromJson (:687): an empty `instances` is `No values in 'instances' array`.
    An empty columnar list decodes to a [0] tensor, as in TF Serving (the data plane then refuses a batch of
    0 rows: test_tfs_rest_docs.py)."""
    assert "No values in 'instances' array" in _refused({"instances": []})
    assert request_inputs({"inputs": []}, ONE)[0]["x"].shape == (0,)


@pytest.mark.parametrize(("literal", "dtype", "accepted"), [
    # AddValueToTensor DT_FLOAT takes any Number (:293-295): a 21-digit integer is read as a double by RapidJSON
    ("100000000000000000000", "float32", True),
    ("1e-50", "float32", True),  # json_tensor_test.cc FloatTensorThatExceedsMinReturnsZero (:261): 0
    # Difference (safer): FloatTensorThatExceedsMaxReturnsInf (:224) feeds +inf for 1e39; tfship refuses it by name
    ("1e39", "float32", False),
    ("1" + "0" * 400, "float64", False),  # RapidJSON: kParseErrorNumberTooBig (a parse error); tfship: out of range
    # int32/16/8/uint8 take IsInt() (:303-308); tfship refuses what the narrower dtype cannot hold (TF Serving
    # would wrap 1000 into an int8 silently: a difference, safer)
    ("2147483647", "int32", True), ("2147483648", "int32", False), ("1000", "int8", False), ("127", "int8", True),
    ("9223372036854775807", "int64", True), ("9223372036854775808", "int64", False),  # IsInt64 (:317)
    ("1.0", "int32", False),  # a double is not IsInt()
])
def test_number_literal_ranges(literal, dtype, accepted):
    signature = Signature("n", inputs={"x": TensorSpec(dtype, (None,))}, outputs={})
    body = parse_body(f'{{"instances": [{literal}]}}'.encode())
    if accepted:
        assert request_inputs(body, signature)[0]["x"].dtype == np.dtype(dtype)
    else:
        message = _refused(body, signature)
        assert "input 'x'" in message and ("is not of expected type" in message or "finite range" in message)


@pytest.mark.parametrize(("text", "decoded"), [("aGk=", b"hi"), ("aGk", b"hi"), ("aGVsbG8=", b"hello"), ("", b"")])
def test_b64_padding_is_optional(text, decoded):
    """json_tensor.cc JsonDecodeBase64Object (:377) uses absl::Base64Unescape, which takes unpadded text."""
    assert b64_decode(text) == decoded


@pytest.mark.parametrize("text", ["a", "!!!!", "aG=k", "a===",])
def test_b64_garbage_is_unable_to_decode(text):
    """`Unable to base64 decode` (json_tensor.cc:386)."""
    message = _refused({"inputs": {"a": [[1, 2]], "b": [{"b64": text}]}}, TWO)
    assert message == "input 'b': Unable to base64 decode"


@pytest.mark.parametrize(("literal", "accepted"), [
    ("1.5", True), ("3.4e38", True), ("Infinity", True), ("NaN", True),  # kParseNanAndInfFlag (json_tensor.cc:484)
    ("1e39", False), ("1e400", False), ("1" + "0" * 400, False),
])
def test_example_float_features_beyond_float32_are_refused(literal, accepted):
    """AddValueToFeature (json_tensor.cc:774-779) stores GetFloat() of a double: 1e39 would be +inf in the
    float_list. Difference (safer): tfship refuses a finite literal past float32 by name, as for tensors."""
    from tfship.serving.tfs.examples import Example, example_from_json

    value = parse_body(f'{{"x": {literal}}}'.encode())
    example = Example()
    if accepted:
        example_from_json(value, example)
        assert len(example.features.feature["x"].float_list.value) == 1
    else:
        with pytest.raises(InvalidRequestError, match="Feature: x has a number past float range"):
            example_from_json(value, example)

"""`serving.tfs.wire`: a Predict answer written straight to bytes is the serialised `PredictResponse`, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

from tfship.core import protocol
from tfship.core.errors import InvalidRequestError
from tfship.serving.dataplane.types import InferenceResponse
from tfship.serving.tfs import converters, wire

DTYPES = ["float32", "float64", ">f4", ">f8", "complex64", "complex128", "float16", "int8", "uint8", "int16",
          "uint16", "int32", ">i4", "int64", "uint32", "uint64", "bool"]
SHAPES = [(), (0,), (1, 784), (3, 0, 2), (2, 5), (4, 1, 1, 3)]


def _array(dtype: str, shape: tuple) -> np.ndarray:
    rng = np.random.default_rng(0)
    values = rng.normal(size=shape) * 300
    if np.dtype(dtype).kind == "c":
        values = values + 1j * rng.normal(size=shape)
    return values.astype(dtype)


@pytest.mark.parametrize("tensor_content", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_bytes_are_the_serialised_response(dtype, shape, tensor_content):
    outputs = {"y": _array(dtype, shape), "scores": np.arange(6, dtype=np.float32).reshape(2, 3)}
    response = InferenceResponse("m", 7, "serving_default", outputs)
    expected = converters.predict_response(response, tensor_content).SerializeToString()
    written = wire.predict_response_bytes(response, tensor_content)
    assert protocol.PredictResponse.FromString(written) == protocol.PredictResponse.FromString(expected)
    assert len(written) == len(expected)  # --max-message-bytes is judged on this length


@pytest.mark.parametrize("version,signature", [(0, ""), (1, "serving_default"), (2**40, "x" * 200)])
def test_model_spec_and_odd_outputs(version, signature):
    outputs = {"s": np.array([b"a", b"bc"], dtype=object), "t" * 300: np.ones((2, 2), np.float32),
               "ė": np.zeros((1,), np.float64), "strided": np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]}
    response = InferenceResponse("model-ü", version, signature, outputs)
    for tensor_content in (False, True):
        expected = converters.predict_response(response, tensor_content)
        written = wire.predict_response_bytes(response, tensor_content)
        assert protocol.PredictResponse.FromString(written) == expected
        assert len(written) == expected.ByteSize()


def test_unsupported_dtype_raises_as_the_converter_does():
    response = InferenceResponse("m", 1, "serving_default", {"t": np.array(["2020-01-01"], dtype="datetime64[D]")})
    for tensor_content in (False, True):
        with pytest.raises(InvalidRequestError) as theirs:
            converters.predict_response(response, tensor_content)
        with pytest.raises(InvalidRequestError) as ours:
            wire.predict_response_bytes(response, tensor_content)
        assert str(ours.value) == str(theirs.value)


def test_varint():
    for value in (1, 127, 128, 300, 2**31, 2**63 - 1):
        proto = protocol.TensorProto()
        proto.tensor_shape.dim.add().size = value
        assert b"\x08" + wire.varint(value) == proto.tensor_shape.dim[0].SerializeToString()
    assert wire.varint(0) == b"\x00" and wire.varint(-1) == b"\xff" * 9 + b"\x01"

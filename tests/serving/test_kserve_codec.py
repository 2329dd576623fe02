"""Open Inference Protocol codec and messages, in-process: every datatype, every encoding, every refusal.

The wire format is checked against the real `tritonclient` package: our descriptor against its
generated `grpc_service.proto` messages field by field, our BYTES encoding against its serializer.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tfship.core import kserve_protocol as kp
from tfship.core.errors import InvalidRequestError, ResourceExhaustedError, UnimplementedError
from tfship.serving.dataplane.types import ModelRef
from tfship.serving.kserve import codec
from tfship.serving.kserve.converters import infer_options, model_ref

MAX = 64 << 20
NUMERIC = [d for d in codec.DATATYPES if d != "BYTES"]


def _fields(descriptor) -> dict:
    return {f.name: (f.number, f.type, f.is_repeated,
                     f.message_type.full_name if f.message_type else None) for f in descriptor.fields}


def test_messages_match_tritonclient_field_by_field():
    from tritonclient.grpc import service_pb2

    ours = kp.protocol.POOL
    for request_cls, response_cls in kp.METHODS.values():
        for cls in (request_cls, response_cls):
            theirs = service_pb2.DESCRIPTOR.message_types_by_name[cls.DESCRIPTOR.name]
            assert _fields(cls.DESCRIPTOR) == _fields(theirs), cls.DESCRIPTOR.full_name
            for nested in cls.DESCRIPTOR.nested_types:
                assert _fields(nested) == _fields(theirs.nested_types_by_name[nested.name]), nested.full_name
    for name in ("InferParameter", "InferTensorContents"):
        assert _fields(ours.FindMessageTypeByName(f"inference.{name}")) == _fields(
            service_pb2.DESCRIPTOR.message_types_by_name[name])
    service = ours.FindServiceByName(kp.SERVICE)
    theirs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        assert (method.input_type.full_name, method.output_type.full_name) == (
            theirs.methods_by_name[method.name].input_type.full_name,
            theirs.methods_by_name[method.name].output_type.full_name)
    assert sorted(m.name for m in service.methods) == sorted(kp.METHODS)


def test_model_config_subset_matches_tritonclients():
    """ModelConfig and its tensors: each field tfship declares has Triton's number and type."""
    from tritonclient.grpc import model_config_pb2

    for name in ("ModelConfig", "ModelInput", "ModelOutput"):
        ours = _fields(kp.protocol.POOL.FindMessageTypeByName(f"inference.{name}"))
        theirs = _fields(model_config_pb2.DESCRIPTOR.message_types_by_name[name])
        assert ours == {k: theirs[k] for k in ours}, name
    ours = kp.protocol.POOL.FindEnumTypeByName("inference.DataType")
    theirs = model_config_pb2.DESCRIPTOR.enum_types_by_name["DataType"]
    assert [(v.name, v.number) for v in ours.values] == [(v.name, v.number) for v in theirs.values]


def test_descriptor_declares_what_the_proto_file_does():
    """The committed .desc and .proto name the same messages and fields (regenerate one from the other)."""
    text = (kp.DESCRIPTOR_SET.parent / "open_inference.proto").read_text()
    for request_cls, response_cls in kp.METHODS.values():
        for cls in (request_cls, response_cls):
            assert f"message {cls.DESCRIPTOR.name} " in text
            for field in cls.DESCRIPTOR.fields:
                assert f" {field.name} = {field.number};" in text, (cls.DESCRIPTOR.name, field.name)


def _sample(datatype: str, shape=(2, 3)) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([b"", b"a", "é".encode(), b"\x00\xff", b"xyz" * 10, b"q"], dtype=object).reshape(shape)
    dtype = codec.DATATYPES[datatype]
    if dtype.kind == "b":
        return np.array([True, False, True, True, False, False]).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([info.min, info.max, 0, 1, info.max - 1, 7], dtype=dtype).reshape(shape)
    return np.array([-1.5, 0.0, 3.25, 1e-3, 65504.0 if datatype == "FP16" else 1e30, -0.0], dtype=dtype).reshape(shape)


@pytest.mark.parametrize("datatype", list(codec.DATATYPES))
def test_raw_round_trip_every_datatype(datatype):
    array = _sample(datatype)
    decoded = codec.from_raw("t", datatype, [2, 3], codec.to_raw(array), MAX)
    assert decoded.dtype == codec.DATATYPES[datatype] and decoded.shape == (2, 3)
    assert decoded.tolist() == array.tolist()
    assert codec.datatype_for(decoded.dtype) == datatype


@pytest.mark.parametrize("datatype", [d for d in codec.DATATYPES if d != "FP16"])
def test_typed_contents_round_trip_every_datatype(datatype):
    array = _sample(datatype)
    contents = kp.InferTensorContents()
    codec.fill_contents(contents, array)
    assert len(getattr(contents, codec.CONTENTS_FIELD[datatype])) == 6
    decoded = codec.from_contents("t", datatype, [2, 3], contents, MAX)
    assert decoded.dtype == codec.DATATYPES[datatype] and decoded.tolist() == array.tolist()


@pytest.mark.parametrize("datatype", list(codec.DATATYPES))
def test_json_round_trip_every_datatype_flat_and_nested(datatype):
    array = _sample(datatype)
    if datatype == "BYTES":
        array = np.array([b"", b"a", "é".encode(), b"zz", b"xyz", b"q"], dtype=object).reshape(2, 3)
    flat = codec.to_json("t", array)
    nested = [flat[:3], flat[3:]]
    for data in (flat, nested):
        decoded = codec.from_json("t", datatype, [2, 3], data, MAX)
        assert decoded.dtype == codec.DATATYPES[datatype] and decoded.tolist() == array.tolist()


def test_bytes_encoding_is_tritonclients():
    from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

    array = _sample("BYTES")
    assert codec.serialize_bytes(array) == serialize_byte_tensor(array).item()
    assert deserialize_bytes_tensor(codec.to_raw(array)).tolist() == array.reshape(-1).tolist()


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(st.sampled_from([np.float32, np.float64, np.int8, np.uint16, np.int64, np.bool_]),
                  hnp.array_shapes(min_dims=0, max_dims=3, max_side=4)))
def test_raw_and_typed_round_trip_any_shape(array):
    datatype = codec.datatype_for(array.dtype)
    raw = codec.from_raw("t", datatype, list(array.shape), codec.to_raw(array), MAX)
    np.testing.assert_array_equal(raw, array)
    contents = kp.InferTensorContents()
    codec.fill_contents(contents, array)
    np.testing.assert_array_equal(codec.from_contents("t", datatype, list(array.shape), contents, MAX), array)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: codec.from_raw("x", "FP32", [2, 2], b"\0" * 15, MAX),
     "input 'x': shape [2, 2] of FP32 needs 16 bytes of raw contents, got 15"),
    (lambda: codec.from_raw("x", "BOOL", [2], b"\x01\x02", MAX), "input 'x': BOOL raw contents must be bytes 0 or 1, got 2"),
    (lambda: codec.from_raw("x", "BYTES", [2], b"\x01\0\0\0a", MAX), "input 'x': BYTES raw contents end after 1 of 2"),
    (lambda: codec.from_raw("x", "BYTES", [1], b"\x09\0\0\0a", MAX), "BYTES element 0 declares 9 bytes; only 1 remain"),
    (lambda: codec.from_raw("x", "BYTES", [1], b"\x01\0\0\0ab", MAX), "hold 1 bytes after the 1 elements"),
    (lambda: codec.from_raw("x", "BF16", [1], b"\0\0", MAX), "input 'x': datatype 'BF16' is not supported; supported: BOOL"),
    (lambda: codec.from_raw("x", "FP32", [-1, 2], b"", MAX), "input 'x': shape [-1, 2] has invalid dim -1"),
    (lambda: codec.from_json("x", "INT32", [2], [1, 2.5], MAX),
     "input 'x': INT32 value at index 1 must be an integer, got 2.5 (number)"),
    (lambda: codec.from_json("x", "INT8", [2], [1, 300], MAX), "input 'x': value 300 is out of range for INT8 [-128, 127]"),
    (lambda: codec.from_json("x", "UINT8", [1], [-1], MAX), "input 'x': value -1 is out of range for UINT8 [0, 255]"),
    (lambda: codec.from_json("x", "BOOL", [2], [True, "false"], MAX),
     "input 'x': BOOL value at index 1 must be true or false, got \"false\" (string)"),
    (lambda: codec.from_json("x", "FP32", [2], [1.0, None], MAX), "FP32 value at index 1 must be a number, got null (null)"),
    (lambda: codec.from_json("x", "FP32", [1], [True], MAX), "FP32 value at index 0 must be a number, got true (boolean)"),
    (lambda: codec.from_json("x", "FP32", [2], [1.0, 1e39], MAX), "input 'x': value 1e+39 at index 1 is out of range for FP32"),
    (lambda: codec.from_json("x", "BYTES", [1], [5], MAX), "BYTES value at index 0 must be a string, got 5 (number)"),
    (lambda: codec.from_json("x", "FP32", [2, 2], [[1.0, 2.0], [3.0]], MAX),
     "input 'x': shape [2, 2] needs 4 values, got 3 in 'data'"),
    (lambda: codec.from_json("x", "FP32", [1], {"b64": "AAAA"}, MAX), "input 'x': 'data' must be a JSON array, got object"),
])
def test_decoding_refusals_name_input_and_cause(call, message):
    with pytest.raises(InvalidRequestError) as err:
        call()
    assert message in str(err.value)
    assert err.value.grpc_code == "INVALID_ARGUMENT" and err.value.http_status == 400


def test_typed_contents_refusals():
    contents = kp.InferTensorContents(fp64_contents=[1.0, 2.0])
    with pytest.raises(InvalidRequestError, match=r"datatype FP32 carries its values in contents.fp32_contents; "
                                                  r"got contents.fp64_contents"):
        codec.from_contents("x", "FP32", [2], contents, MAX)
    with pytest.raises(InvalidRequestError, match=r"input 'x': shape \[3\] needs 3 values, got 2 in contents.fp64_contents"):
        codec.from_contents("x", "FP64", [3], contents, MAX)
    with pytest.raises(InvalidRequestError, match=r"value 128 is out of range for INT8 \[-128, 127\]"):
        codec.from_contents("x", "INT8", [2], kp.InferTensorContents(int_contents=[1, 128]), MAX)
    with pytest.raises(InvalidRequestError, match=r"FP16 has no typed contents field; send it in raw_input_contents"):
        codec.from_contents("x", "FP16", [1], kp.InferTensorContents(), MAX)


def test_shapes_that_expand_past_the_limit_are_refused_before_allocating():
    with pytest.raises(ResourceExhaustedError) as err:
        codec.from_raw("x", "FP32", [1 << 30, 8, 8, 1], b"\0" * 4, MAX)
    assert str(err.value) == (f"input 'x': shape [1073741824, 8, 8, 1] of FP32 decodes to {(1 << 30) * 256} bytes, "
                              f"above the limit of {MAX} bytes (--max-message-bytes)")
    with pytest.raises(ResourceExhaustedError, match="above the limit"):
        codec.from_json("x", "INT64", [1 << 28], [1], 1 << 20)


def test_output_encodings():
    with pytest.raises(InvalidRequestError, match=r"output 'o' holds bytes that are not UTF-8.*binary_data"):
        codec.to_json("o", np.array([b"\xff"], dtype=object))
    with pytest.raises(UnimplementedError, match="dtype complex64 has no Open Inference Protocol datatype"):
        codec.datatype_for(np.dtype(np.complex64))
    with pytest.raises(UnimplementedError, match="FP16 has no typed contents field"):
        codec.fill_contents(kp.InferTensorContents(), np.zeros(2, np.float16))
    assert codec.to_raw(np.array([1, 2], dtype=">i4")) == b"\x01\0\0\0\x02\0\0\0"  # little-endian on the wire


def test_version_strings_and_parameters():
    assert model_ref("m", "") == ModelRef("m")
    assert model_ref("m", "0002") == ModelRef("m", version=2)
    assert model_ref("m", "stable") == ModelRef("m", label="stable")
    with pytest.raises(InvalidRequestError, match="model name is required"):
        model_ref("", "1")
    assert infer_options({}).signature_name == "serving_default" and infer_options({}).deadline is None
    options = infer_options({"signature_name": "scale", "timeout": 2_000_000}, time_remaining=1.0)
    assert options.signature_name == "scale" and options.deadline is not None
    with pytest.raises(InvalidRequestError, match="parameter 'sequence_id': sequence batching is not supported"):
        infer_options({"sequence_id": 3})
    with pytest.raises(InvalidRequestError, match=r"parameter 'timeout' must be a positive integer \(microseconds\)"):
        infer_options({"timeout": -5})


def test_large_payload_functions_run_in_a_spawned_helper_process():
    """What `serving.dataplane.offload` runs for large V2 payloads works across a `spawn` process, errors included."""
    import json
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from tfship.serving.kserve.grpc_service import decode_infer_inputs
    from tfship.serving.kserve.rest import decode_body, encode_answer

    request = kp.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 2]).contents.fp32_contents.extend([1, 2, 3, 4])
    body = json.dumps({"id": "1", "inputs": [{"name": "y", "datatype": "INT8", "shape": [2], "data": [1, -2]}]})
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        ((name, datatype, array),) = pool.submit(decode_infer_inputs, request.SerializeToString(), MAX).result()
        parsed, ((_, _, y),) = pool.submit(decode_body, None, body.encode(), MAX).result()
        header, blobs = pool.submit(encode_answer, "m", 3, [("y", y)], {"y": True}, False, "1").result()
        with pytest.raises(InvalidRequestError, match="value 300 is out of range for INT8"):
            pool.submit(decode_body, None, body.replace("-2", "300").encode(), MAX).result()
    assert (name, datatype, array.tolist()) == ("x", "FP32", [[1.0, 2.0], [3.0, 4.0]])
    assert parsed == {"id": "1"} and y.dtype == np.int8 and y.tolist() == [1, -2]
    assert json.loads(header) == {"model_name": "m", "model_version": "3", "id": "1", "outputs": [
        {"name": "y", "datatype": "INT8", "shape": [2], "parameters": {"binary_data_size": 2}}]}
    assert blobs == [b"\x01\xfe"]


@pytest.mark.parametrize(("data", "named"), [([1.0, None], "null (null)"), ([True], "true (boolean)"),
                                             ([{"a": 1}], '{"a":1} (object)')])
def test_a_refused_value_is_named_as_json_names_it(data, named):
    """Issue 21: a client-facing message said `None (NoneType)` for a JSON null: Python's words, not the client's."""
    with pytest.raises(InvalidRequestError) as err:
        codec.from_json("x", "FP32", [len(data)], data, MAX)
    assert str(err.value).endswith(f"must be a number, got {named}")
    assert "NoneType" not in str(err.value) and "None" not in str(err.value)

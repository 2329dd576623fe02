"""Wire compatibility of the TF-free messages with tensorflow_serving's, and tensor conversion."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tfship.core import protocol
from tfship.core.errors import InvalidRequestError
from tfship.serving.dataplane.tensors import from_tensor_proto, to_tensor_proto


def _predict_request():
    request = protocol.PredictRequest(output_filter=["logits"])
    request.model_spec.name = "digits"
    request.model_spec.version_label = "stable"
    request.model_spec.signature_name = "serving_default"
    request.inputs["image"].CopyFrom(to_tensor_proto(np.ones((2, 8, 8, 1), np.float32)))
    request.inputs["names"].CopyFrom(to_tensor_proto(np.array([b"a", b"b"], dtype=object)))
    return request


def test_messages_round_trip_through_tensorflow_serving_classes():
    from tensorflow_serving.apis import get_model_status_pb2, predict_pb2
    from tensorflow_serving.config import model_server_config_pb2

    ours = _predict_request()
    theirs = predict_pb2.PredictRequest.FromString(ours.SerializeToString())
    assert theirs.model_spec.version_label == "stable" and list(theirs.output_filter) == ["logits"]
    assert protocol.PredictRequest.FromString(theirs.SerializeToString()) == ours

    status = get_model_status_pb2.GetModelStatusResponse()
    entry = status.model_version_status.add(version=3, state=get_model_status_pb2.ModelVersionStatus.AVAILABLE)
    entry.status.error_message = "ok"
    back = protocol.GetModelStatusResponse.FromString(status.SerializeToString())
    assert back.model_version_status[0].version == 3 and back.model_version_status[0].state == 30

    config = model_server_config_pb2.ModelServerConfig()
    model = config.model_config_list.config.add(name="digits", base_path="/m")
    model.model_version_policy.latest.num_versions = 2
    model.version_labels["stable"] = 1
    ours_config = protocol.ModelServerConfig.FromString(config.SerializeToString())
    assert ours_config.model_config_list.config[0].model_version_policy.latest.num_versions == 2
    assert model_server_config_pb2.ModelServerConfig.FromString(ours_config.SerializeToString()) == config


def test_tensor_protos_match_tensorflow():
    import tensorflow as tf

    for array in (np.arange(12, dtype=np.float32).reshape(3, 4), np.array([1, -2], np.int64),
                  np.array([True, False]), np.array([b"x", b"yz"], dtype=object), np.float16([1.5, 2.0])):
        ours = to_tensor_proto(array)
        theirs = tf.make_tensor_proto(array)
        np.testing.assert_array_equal(tf.make_ndarray(type(theirs).FromString(ours.SerializeToString())), array)
        decoded = from_tensor_proto(protocol.TensorProto.FromString(theirs.SerializeToString()))
        assert decoded.dtype == array.dtype
        np.testing.assert_array_equal(decoded, array)
    scalar_fill = tf.make_tensor_proto(7.0, shape=[2, 2])  # one value broadcast, as TF does
    np.testing.assert_array_equal(from_tensor_proto(protocol.TensorProto.FromString(
        scalar_fill.SerializeToString())), np.full((2, 2), 7.0, np.float32))


def test_tensor_size_mismatch_is_invalid_argument():
    proto = to_tensor_proto(np.ones((2, 3), np.float32))
    proto.tensor_shape.dim[0].size = 5
    with pytest.raises(InvalidRequestError, match=r"input 'x': shape \[5, 3\] needs 15 values, got 6"):
        from_tensor_proto(proto, "x")


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(dtype=st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_]),
                  shape=hnp.array_shapes(min_dims=0, max_dims=4, max_side=5)))
def test_tensor_round_trip_property(array):
    back = from_tensor_proto(protocol.TensorProto.FromString(to_tensor_proto(array).SerializeToString()))
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)

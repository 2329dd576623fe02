"""Half-plus-two models built here (y = 0.5 * x + 2), in the two SavedModel styles TF Serving serves.

* `build_tf1`: a TF1 graph saved with `SavedModelBuilder` (placeholder `x` float32 [-1, 1], signature
  `serving_default` with method_name `tensorflow/serving/predict`): TensorFlow feeds it by tensor name, so
  a `[3]` tensor gives `[3]` answers, as TF Serving's own half_plus_two does.
* `build_tf2`: a `tf.function` with input signature [-1, 1] saved by `tf.saved_model.save`, computing
  `x @ [[0.5]] + 2`: the model itself refuses a `[3]` tensor (MatMul needs rank 2), which is INVALID_ARGUMENT.
"""

from __future__ import annotations

from pathlib import Path


def build_tf1(version_dir: Path) -> Path:
    """Write the TF1-style half-plus-two into `version_dir` (created); returns it."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 1], name="x")
        a = tf.Variable(0.5, name="a")
        b = tf.Variable(2.0, name="b")
        y = tf.add(a * x, b, name="y")
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(str(version_dir))
            signature = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={"serving_default": signature})
            builder.save()
    return version_dir


def build_tf2(version_dir: Path) -> Path:
    """Write the TF2 half-plus-two (input signature [-1, 1], a MatMul) into `version_dir`; returns it."""
    import tensorflow as tf

    class HalfPlusTwo(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def serving_default(self, x):
            return {"y": tf.matmul(x, tf.constant([[0.5]])) + 2.0}

    module = HalfPlusTwo()
    tf.saved_model.save(module, str(version_dir), signatures={"serving_default": module.serving_default})
    return version_dir


def build_tflite_without_runners(version_dir: Path, signature_defs: bool = False) -> Path:
    """`model.tflite` of a half-plus-two on a fixed [1, 1] input, its signature runners removed (as TF
    Serving's own TFLite test models have none); with `signature_defs`, TF Serving's `signature_defs_metadata`
    maps alias `x` / `y` onto the tensors. Returns `version_dir`.
    """
    import flatbuffers
    import tensorflow as tf
    from ai_edge_litert import schema_py_generated as schema
    from flatbuffers import flexbuffers

    from tfship.core import protocol

    function = tf.function(lambda x: {"y": 0.5 * x + 2.0}).get_concrete_function(tf.TensorSpec([1, 1], tf.float32))
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function])
    model = schema.ModelT.InitFromPackedBuf(converter.convert(), 0)
    model.signatureDefs = []
    if signature_defs:
        graph = model.subgraphs[0]
        names = [graph.tensors[i].name.decode() for i in (graph.inputs[0], graph.outputs[0])]
        signature = protocol.SignatureDef(method_name="tensorflow/serving/predict")
        for target, alias, name in ((signature.inputs, "x", names[0]), (signature.outputs, "y", names[1])):
            info = target[alias]
            info.name, info.dtype = f"{name}:0", 1  # DT_FLOAT
            info.tensor_shape.dim.add(size=1)
            info.tensor_shape.dim.add(size=1)
        buffer = schema.BufferT()
        buffer.data = list(flexbuffers.Dumps({"serving_default": signature.SerializeToString().decode("ascii")}))
        model.buffers.append(buffer)
        metadata = schema.MetadataT()
        metadata.name, metadata.buffer = b"signature_defs_metadata", len(model.buffers) - 1
        model.metadata = [*(model.metadata or []), metadata]
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / "model.tflite").write_bytes(bytes(builder.Output()))
    return version_dir

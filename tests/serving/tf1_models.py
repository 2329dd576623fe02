"""Builds a TF1-style SavedModel (tf.compat.v1 graph + SavedModelBuilder) whose signatures parse tf.Example.

The graph: a string placeholder `tf_example` (declared [-1] or, as old exporters wrote it, with an empty shape) of serialized `tensorflow.Example`s is parsed by
`ParseExample` into `x` float32 [-1, 1] (feature `x`, default 0.0; `x` is `Identity(parsed x)`) and `k`
float32 [-1, 1] (feature `k`, default 1.0); `y = a * x * k + b` and `y_from_x = a * x + b`, with variables
`a` = 0.5 and `b` = 3.0 restored from `variables/`. Class names come from a lookup table the `main_op`
initialises from the asset `classes.txt`: a loader must restore variables, map assets and run the init op.

Signatures (the method names TF1 Estimators write):
- `serving_default` (predict): `inputs` (the examples) -> `outputs` (y): accepted by Regress as a predict
  signature shaped like a regression one.
- `regress_x_to_y` (regress): `inputs` -> `outputs` (y).
- `classify_x_to_y` (classify): `inputs` -> `scores` float32 [-1, 2] = [y, -y] and `classes` string
  [-1, 2] = ["pos", "neg"] per row.
- `classify_scores_only` (classify): `inputs` -> `scores` only.
- `echo` (predict): `inputs` -> `echoed` (the fed tensor itself) and `outputs` (y).
- `predict_x` (predict): `x` (the parsed tensor, not a placeholder) -> `y` (y_from_x): TF Serving's half_plus_two
  layout, servable only by feeding a graph tensor by name.
"""

from __future__ import annotations

from pathlib import Path

A, B = 0.5, 3.0
CLASSES = ("pos", "neg")


def build_tf1_example_model(version_dir: Path, legacy_placeholder: bool = True) -> None:
    """Write the graph above as a SavedModel with one MetaGraph tagged `serve` into `version_dir`.

    With `legacy_placeholder`, `tf_example` has the empty shape attr of pre-TF-1.2 exports (TF Serving's
    `half_plus_three` is such a model): `tf.saved_model.load` cannot import it, TF Serving can.
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        serialized = v1.placeholder(tf.string, [None], name="tf_example")
        # The TF1 op (`ParseExample`, not `ParseExampleV2`), as Estimator-era exports hold it.
        parsed = tf.raw_ops.ParseExample(
            serialized=serialized, names=tf.constant([], tf.string), sparse_keys=[],
            dense_keys=[tf.constant("x"), tf.constant("k")],
            dense_defaults=[tf.constant([0.0]), tf.constant([1.0])], sparse_types=[], dense_shapes=[[1], [1]])
        features = dict(zip(("x", "k"), parsed.dense_values))
        a = v1.get_variable("a", [], initializer=v1.zeros_initializer())
        b = v1.get_variable("b", [], initializer=v1.zeros_initializer())
        x = tf.identity(features["x"], name="x")
        y = tf.identity(a * x * features["k"] + b, name="y")
        y_from_x = tf.identity(a * x + b, name="y_from_x")
        scores = tf.concat([y, -y], axis=1, name="scores")
        vocabulary = Path(version_dir).parent / "classes.txt"  # copied into assets/ by the builder
        vocabulary.parent.mkdir(parents=True, exist_ok=True)
        vocabulary.write_text("\n".join(CLASSES) + "\n")
        asset = tf.constant(str(vocabulary), name="classes_file")
        v1.add_to_collection(v1.GraphKeys.ASSET_FILEPATHS, asset)
        table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
            asset, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE),
            default_value="?")
        names = table.lookup(tf.constant([[0, 1]], tf.int64))
        classes = tf.tile(names, [tf.shape(y)[0], 1], name="classes")
        info = v1.saved_model.utils.build_tensor_info
        examples = {"inputs": info(serialized)}
        signatures = {
            "serving_default": v1.saved_model.signature_def_utils.build_signature_def(
                examples, {"outputs": info(y)}, v1.saved_model.signature_constants.PREDICT_METHOD_NAME),
            "regress_x_to_y": v1.saved_model.signature_def_utils.build_signature_def(
                examples, {"outputs": info(y)}, v1.saved_model.signature_constants.REGRESS_METHOD_NAME),
            "classify_x_to_y": v1.saved_model.signature_def_utils.build_signature_def(
                examples, {"scores": info(scores), "classes": info(classes)},
                v1.saved_model.signature_constants.CLASSIFY_METHOD_NAME),
            "classify_scores_only": v1.saved_model.signature_def_utils.build_signature_def(
                examples, {"scores": info(scores)}, v1.saved_model.signature_constants.CLASSIFY_METHOD_NAME),
            "echo": v1.saved_model.signature_def_utils.build_signature_def(
                examples, {"echoed": info(serialized), "outputs": info(y)},
                v1.saved_model.signature_constants.PREDICT_METHOD_NAME),
            "predict_x": v1.saved_model.signature_def_utils.build_signature_def(
                {"x": info(x)}, {"y": info(y_from_x)},
                v1.saved_model.signature_constants.PREDICT_METHOD_NAME),
        }
        with v1.Session(graph=graph) as session:
            session.run([a.assign(A), b.assign(B)])
            builder = v1.saved_model.Builder(str(version_dir))
            builder.add_meta_graph_and_variables(
                session, ["serve"], signature_def_map=signatures,
                assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS),
                main_op=v1.tables_initializer())  # not main_op(): that re-initialises the variables
            builder.save()
    if legacy_placeholder:
        _clear_placeholder_shape(Path(version_dir) / "saved_model.pb", "tf_example")


def _clear_placeholder_shape(path: Path, name: str) -> None:
    """Give placeholder `name` an empty `shape` attr and the graph GraphDef version 21, as exporters before
    TF 1.2 wrote "any shape".

    Imported as written (a Session, TF Serving's way) the empty shape means unknown; `tf.saved_model.load`
    re-traces the graph at today's version, reads it as a scalar and refuses the graph ("Shape must be rank 1
    but is rank 0 for ParseExample").
    """
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel.FromString(path.read_bytes())
    graph_def = saved.meta_graphs[0].graph_def
    graph_def.versions.producer = 21  # the last GraphDef version whose empty Placeholder shape means "unknown"
    for node in graph_def.node:
        if node.name == name:
            node.attr["shape"].shape.Clear()
            node.attr.pop("_output_shapes", None)
    path.write_bytes(saved.SerializeToString())


def expected_y(x: float, k: float = 1.0) -> float:
    """What the graph answers for one example with features `x` and `k` (float32 arithmetic)."""
    return A * x * k + B


def build_tf2_example_model(version_dir: Path) -> None:
    """A TF2 SavedModel (`tf.saved_model.save`) with the same arithmetic behind `tf.function`s that parse
    tf.Example: `regress_x_to_y` (`inputs` -> `outputs` [-1, 1]) and `classify_x_to_y` (`inputs` -> `scores`).
    """
    import tensorflow as tf

    spec = {"x": tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0]),
            "k": tf.io.FixedLenFeature([1], tf.float32, default_value=[1.0])}

    class Module(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = tf.Variable(A), tf.Variable(B)

        def _y(self, serialized):
            features = tf.io.parse_example(serialized, spec)
            return self.a * features["x"] * features["k"] + self.b

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def regress(self, inputs):
            return {"outputs": self._y(inputs)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def classify(self, inputs):
            y = self._y(inputs)
            return {"scores": tf.concat([y, -y], axis=1)}

    module = Module()
    tf.saved_model.save(module, str(version_dir),
                        signatures={"regress_x_to_y": module.regress, "classify_x_to_y": module.classify})

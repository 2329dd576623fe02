"""A model equivalent to TF Serving's testdata `saved_model_half_plus_three/00000123` (y = 0.5 * x + 3), built the
way TF Serving's own export script builds it (tensorflow_serving/servables/tensorflow/testdata/
saved_model_half_plus_two.py, `_generate_saved_model_for_half_plus_two`, TF1 branch): a `tf_example` string
placeholder [-1] parsed with `parse_example` ({"x": FixedLen [1] float32, "x2": FixedLen [1] default 0}),
`x = identity(parsed x)`, `y = a * x + c` with variables a = 0.5, c = 3, saved with `SavedModelBuilder`.

Signatures, named as in the testdata's saved_model.pb (which TF Serving's REST API page uses):
- `serving_default`: method `tensorflow/serving/predict`, input `x` (the parsed tensor, fed by name) -> `y`;
- `tensorflow/serving/regress`: method `tensorflow/serving/regress`, `inputs` (serialized tf.Example, declared
  DT_FLOAT as in the testdata) -> `outputs`;
- `tensorflow/serving/classify`: method `tensorflow/serving/classify`, `inputs` -> `scores` (the export
  script's `classify_x_to_y`; the testdata has no classify signature, this one exercises `:classify`).
"""

from __future__ import annotations

from pathlib import Path

NAME = "saved_model_half_plus_three"
VERSION = 123


def build(version_dir: Path) -> Path:
    """Write the model into `version_dir` (created); returns it."""
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        serialized = v1.placeholder(tf.string, name="tf_example", shape=[None])
        features = {"x": tf.io.FixedLenFeature([1], dtype=tf.float32),
                    "x2": tf.io.FixedLenFeature([1], dtype=tf.float32, default_value=[0.0])}
        parsed = tf.io.parse_example(serialized, features)
        x = tf.identity(parsed["x"], name="x")
        a = tf.Variable(0.5, name="a")
        c = tf.Variable(3.0, name="c")
        y = tf.add(tf.multiply(a, x), c, name="y")
        utils = v1.saved_model.utils
        constants = v1.saved_model.signature_constants
        # as in the testdata's saved_model.pb: the regress input declared DT_FLOAT (unknown shape), though the
        # tensor is the string placeholder; TF Serving does not check it
        declared_float = utils.build_tensor_info(serialized)
        declared_float.dtype = tf.float32.as_datatype_enum
        declared_float.ClearField("tensor_shape")
        regress = v1.saved_model.signature_def_utils.build_signature_def(
            {constants.REGRESS_INPUTS: declared_float},
            {constants.REGRESS_OUTPUTS: utils.build_tensor_info(y)}, constants.REGRESS_METHOD_NAME)
        classify = v1.saved_model.signature_def_utils.build_signature_def(
            {constants.CLASSIFY_INPUTS: utils.build_tensor_info(serialized)},
            {constants.CLASSIFY_OUTPUT_SCORES: utils.build_tensor_info(y)}, constants.CLASSIFY_METHOD_NAME)
        predict = v1.saved_model.signature_def_utils.predict_signature_def({"x": x}, {"y": y})
        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(str(version_dir))
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
                "serving_default": predict, constants.REGRESS_METHOD_NAME: regress,
                constants.CLASSIFY_METHOD_NAME: classify})
            builder.save()
    return version_dir

"""SavedModels as users bring them (shared by pipeline, signature and serving tests): a TF1 / Estimator-style
export with `serve`, `train` and `eval` MetaGraphs, and a Keras model wrapped in a custom `tf.Module`
saved after `fit` (its optimizer still tracked)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

WEIGHTS = (np.arange(12, dtype=np.float32).reshape(4, 3) / 10, np.array([0.1, -0.2, 0.3], np.float32))


def tf1_multi_meta_graph(path: Path) -> Path:
    """`tf.compat.v1.saved_model.Builder` export: MetaGraphs tagged `train` (first, with the variables),
    `serve` (`serving_default`: `features` f32 [-1, 4] -> `probabilities` f32 [-1, 3], `class_id` i64 [-1])
    and `eval`. Variables: `w` [4, 3], `b` [3], `global_step` and Adam's slots and powers.
    Outputs: softmax(features @ WEIGHTS[0] + WEIGHTS[1]) and its argmax."""
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        features = v1.placeholder(tf.float32, [None, 4], name="features")
        label = v1.placeholder(tf.int64, [None], name="label")
        w = v1.get_variable("w", initializer=tf.constant(WEIGHTS[0]))
        b = v1.get_variable("b", initializer=tf.constant(WEIGHTS[1]))
        logits = tf.matmul(features, w) + b
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=label, logits=logits))
        v1.train.AdamOptimizer(0.01).minimize(loss, global_step=v1.train.get_or_create_global_step())

        def signature(inputs, outputs, method):
            info = v1.saved_model.utils.build_tensor_info
            return v1.saved_model.signature_def_utils.build_signature_def(
                {k: info(v) for k, v in inputs.items()}, {k: info(v) for k, v in outputs.items()}, method)

        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(str(path))
            builder.add_meta_graph_and_variables(session, ["train"], signature_def_map={
                "train": signature({"features": features, "label": label}, {"loss": loss},
                                   "tensorflow/supervised/training")}, strip_default_attrs=True)
            builder.add_meta_graph(["serve"], signature_def_map={"serving_default": signature(
                {"features": features}, {"probabilities": tf.nn.softmax(logits), "class_id": tf.argmax(logits, -1)},
                "tensorflow/serving/predict")}, strip_default_attrs=True)
            builder.add_meta_graph(["eval"], signature_def_map={"eval": signature(
                {"features": features, "label": label}, {"loss": loss}, "tensorflow/supervised/eval")},
                strip_default_attrs=True)
            builder.save()
    return path


def tf1_expected(features: np.ndarray) -> dict[str, np.ndarray]:
    """What `tf1_multi_meta_graph`'s `serving_default` returns for `features` [N, 4]."""
    logits = features.astype(np.float64) @ WEIGHTS[0] + WEIGHTS[1]
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return {"probabilities": exp / exp.sum(axis=1, keepdims=True), "class_id": logits.argmax(axis=1)}


def wrapped_keras_after_fit(path: Path, uses_step: bool = False) -> Path:
    """A Keras MLP (`features` f32 [-1, 6] -> 2 logits) trained 2 epochs with Adam, wrapped in a `tf.Module`
    that tracks the model and its optimizer, saved with `serving_default` -> {`logits`}. With `uses_step`
    the serving function also returns `steps_seen` = the optimizer's iteration count (training state that
    serving really reads)."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).random((64, 6), dtype=np.float32)
    y = (x.sum(axis=1) > 3).astype(np.int64)
    model = keras.Sequential([keras.Input((6,), name="features"), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=2, verbose=0)

    class Wrapper(tf.Module):
        def __init__(self):
            super().__init__()
            self.model, self.optimizer = model, model.optimizer

        @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32, name="features")])
        def serve(self, features):
            out = {"logits": self.model(features, training=False)}
            if uses_step:
                out["steps_seen"] = tf.fill(tf.shape(features)[:1], self.optimizer.iterations)
            return out

    wrapper = Wrapper()
    tf.saved_model.save(wrapper, str(path), signatures={"serving_default": wrapper.serve})
    return path

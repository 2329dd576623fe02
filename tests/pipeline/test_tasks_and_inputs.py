"""Tasks and their metrics (core.tasks), the feature spec as named inputs, the early trainability check,
multi-input factories with per-task heads, sparse embedding gradients, and the synthetic recommender data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tfship.core.errors import ConfigError
from tfship.core.tasks import primary, roc_auc, task_metrics, worse_by
from tfship.pipeline.config import DataSection, load_config
from tfship.pipeline.data.recommender_data import RecommenderDataSpec, recommender_feature_spec, write_recommender_data
from tfship.pipeline.training.input_specs import check_trainable, input_specs, parse_batch

from .conftest import run_tfship


def test_auc_matches_its_definition_with_ties_and_refuses_one_class():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, 300).astype(float)  # many ties
    labels = rng.integers(0, 2, 300)
    positive, negative = scores[labels == 1], scores[labels == 0]
    pairs = (positive[:, None] > negative[None, :]) + 0.5 * (positive[:, None] == negative[None, :])
    assert roc_auc(scores, labels) == pytest.approx(pairs.mean(), abs=1e-12)
    assert roc_auc(labels, labels) == 1.0 and roc_auc(-labels, labels) == 0.0
    with pytest.raises(ValueError, match="both classes"):
        roc_auc(scores, np.ones(300))
    with pytest.raises(ValueError, match="0 or 1"):
        roc_auc(scores, labels * 2)


def test_task_metrics_and_which_way_is_worse():
    labels = np.array([0, 1, 1, 0])
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0], [1.0, 0.5]])
    figures = task_metrics("classification", logits, labels)
    assert figures["accuracy"] == 0.75
    assert figures["loss"] == pytest.approx(-np.mean(np.log(np.exp(logits[[0, 1, 2, 3], labels]) /
                                                            np.exp(logits).sum(axis=1))))
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)  # a softmax head: no second one
    assert task_metrics("classification", probabilities, labels)["loss"] == pytest.approx(figures["loss"])
    near_one_hot = np.array([[0.999, 0.001], [0.001, 0.999], [0.999, 0.001], [0.999, 0.001]])
    assert task_metrics("classification", near_one_hot, labels)["loss"] == pytest.approx(-np.log(0.001) / 4 +
                                                                                       -np.log(0.999) * 3 / 4)
    binary = task_metrics("binary", np.array([[0.9], [0.8], [0.3], [0.1]]), labels)  # probabilities
    assert binary["auc"] == 0.5 and binary["accuracy"] == 0.5 and "loss" not in binary
    assert task_metrics("binary", np.array([-2.0, 3.0, 1.0, -1.0]), labels)["auc"] == 1.0  # logits
    regression = task_metrics("regression", np.array([[1.0], [2.0], [4.0]]), np.array([1.0, 1.0, 1.0]))
    assert regression["mae"] == pytest.approx(4 / 3) and regression["rmse"] == pytest.approx(np.sqrt(10 / 3))
    assert primary("binary").name == "auc" and not primary("regression").higher_is_better
    assert worse_by("regression", 2.0, 1.5) == 0.5 and worse_by("binary", 0.70, 0.75) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="expected one of"):
        task_metrics("ranking", logits, labels)
    with pytest.raises(ValueError, match="one column"):
        task_metrics("binary", logits[:3], labels[:3])


def _data(**spec) -> DataSection:
    return DataSection(source="tfrecord", path="/nowhere/*.tfrecord", label="label",
                       feature_spec={"label": {"dtype": "int64"}, **spec})


def test_feature_spec_becomes_named_inputs():
    specs = input_specs(_data(
        price={"shape": [3]}, country={"dtype": "string", "kind": "categorical", "vocabulary": ["de", "fr"],
                                      "input_name": "country_id"},
        clicks={"dtype": "int64", "kind": "sequence", "num_ids": 100, "length": 5}))
    assert [(s.name, s.kind, s.dtype, s.shape, s.num_ids) for s in specs] == [
        ("price", "dense", "float32", (3,), 0), ("country_id", "categorical", "string", (), 3),
        ("clicks", "sequence", "int64", (5,), 100)]  # strings stay raw: the model's StringLookup maps them
    open_vocabulary = input_specs(_data(c={"dtype": "string", "kind": "categorical"}))[0]
    assert open_vocabulary.needs_vocabulary  # no refusal: the scan finds the values


@pytest.mark.parametrize(("spec", "message"), [
    ({"name": {"dtype": "string"}}, r"data.feature_spec.name.dtype = 'string': a dense input is numeric"),
    ({"c": {"dtype": "int64", "kind": "categorical"}}, r"data.feature_spec.c.num_ids = None"),
    ({"c": {"dtype": "float32", "kind": "categorical"}}, r"data.feature_spec.c.dtype = 'float32'"),
    ({"s": {"dtype": "int64", "kind": "sequence", "num_ids": 9}}, r"data.feature_spec.s.length = None"),
    ({"c": {"dtype": "int64", "kind": "categorical", "num_ids": 9, "shape": [2]}}, r"c.shape = \[2\]"),
])
def test_a_feature_spec_that_is_no_model_input_is_named(spec, message):
    with pytest.raises(ConfigError, match=message):
        input_specs(_data(**spec))


def test_parse_batch_pads_sequences_and_keeps_strings_raw():
    import tensorflow as tf

    specs = input_specs(_data(
        country={"dtype": "string", "kind": "categorical", "vocabulary": ["de", "fr"]},
        clicks={"dtype": "int64", "kind": "sequence", "num_ids": 100, "length": 3},
        tags={"dtype": "string", "kind": "sequence", "vocabulary": ["a", "b"], "ragged": True}))

    def example(country, clicks, tags, label):
        feature = {"country": tf.train.Feature(bytes_list=tf.train.BytesList(value=[country])),
                   "clicks": tf.train.Feature(int64_list=tf.train.Int64List(value=clicks)),
                   "tags": tf.train.Feature(bytes_list=tf.train.BytesList(value=tags)),
                   "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    records = tf.constant([example(b"fr", [7], [b"b", b"zz", b"a"], 1), example(b"xx", [1, 2, 3, 4], [], 0)])
    inputs, labels = parse_batch(specs, "label")(records)
    assert inputs["country"].numpy().tolist() == [b"fr", b"xx"]  # raw: the model's StringLookup maps them
    assert inputs["clicks"].numpy().tolist() == [[7, 0, 0], [1, 2, 3]]  # padded, cut
    assert inputs["tags"].to_list() == [[b"b", b"zz", b"a"], []]  # ragged, raw
    assert labels.numpy().tolist() == [1, 0]


def test_a_multi_input_config_is_refused_before_any_data_is_read(tmp_path):
    config = tmp_path / "multi.toml"
    config.write_text(
        '[data]\nsource = "tfrecord"\npath = "/nowhere/part-*.tfrecord"\nlabel = "label"\n'
        '[data.feature_spec.dense]\nshape = [4]\n'
        '[data.feature_spec.item_id]\ndtype = "int64"\nkind = "categorical"\nnum_ids = 100\n'
        '[data.feature_spec.label]\ndtype = "int64"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"model.kind = 'cnn': data.feature_spec declares 2 model inputs "
                                          r"\[dense \(dense\), item_id \(categorical\)\].*model.kind = 'tabular'"):
        check_trainable(load_config(config))
    done = run_tfship("train", "--config", str(config), "--runs-dir", str(tmp_path / "runs"), timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr[-2000:]
    assert "data.feature_spec declares 2 model inputs" in lines[-1] and "/nowhere" not in done.stderr  # no glob tried
    single = load_config(config, {"data.features": ["dense"]})  # one dense input: trainable as before
    assert [s.name for s in check_trainable(single)] == ["dense"]


@pytest.fixture(scope="module")
def recommender_data(tmp_path_factory):
    spec = RecommenderDataSpec(records=24_000, shards=4, users=500, items=500, history_length=8, seed=3)
    folder = tmp_path_factory.mktemp("rec")
    return spec, folder, write_recommender_data(folder, spec, say=lambda line: None)


def test_generator_writes_shards_and_a_planted_signal(recommender_data):
    spec, folder, manifest = recommender_data
    assert sorted(p.name for p in folder.glob("*.tfrecord")) == manifest["shards"] and len(manifest["shards"]) == 4
    assert not list(folder.glob("*.partial"))
    assert json.loads((folder / "manifest.json").read_text())["planted_auc"] == manifest["planted_auc"]
    assert 0.7 < manifest["planted_auc"] < 0.95  # a signal, not a give-away
    assert manifest["test"] == [manifest["shards"][-1]] and manifest["validation"] == [manifest["shards"][-2]]
    with pytest.raises(ConfigError, match="--records = 2 < --shards = 4"):
        RecommenderDataSpec(records=2, shards=4).check()


def _dataset(spec, folder, names, specs):
    import tensorflow as tf

    files = [str(folder / name) for name in names]
    return tf.data.TFRecordDataset(files).batch(256).map(parse_batch(specs, "label")).prefetch(2)


def test_recommender_learns_the_planted_signal_with_sparse_embedding_gradients(recommender_data):
    import keras
    import tensorflow as tf

    from tfship.pipeline.training.multi_input import recommender, task_loss

    spec, folder, manifest = recommender_data
    data = DataSection(source="tfrecord", path=str(folder / "*.tfrecord"), label="label",
                       feature_spec=recommender_feature_spec(spec))
    specs = input_specs(data)
    model = recommender(specs, embedding_dim=16)
    assert sorted(t.name for t in model.inputs) == ["dense", "history", "item_id", "user_id"]
    optimizer, loss_fn = keras.optimizers.SGD(0.5), task_loss("binary")
    tables = {v.path for v in model.trainable_variables if "embedding" in v.path}
    assert len(tables) == 3

    @tf.function
    def step(inputs, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(tf.cast(labels[:, None], tf.float32), model(inputs, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)
        return {v.path: type(g).__name__ for g, v in zip(gradients, model.trainable_variables)}

    user_table = next(v for v in model.trainable_variables if v.path.startswith("user_id_embedding"))
    before = user_table.numpy()
    inputs, labels = next(iter(_dataset(spec, folder, manifest["train"], specs)))
    kinds = step(inputs, labels)
    assert {path: kinds[path] for path in tables} == {path: "IndexedSlices" for path in tables}
    touched = np.unique(inputs["user_id"].numpy())
    changed = np.nonzero(np.any(user_table.numpy() != before, axis=1))[0]
    assert set(changed) <= set(touched) and len(changed) > 0  # only the batch's rows were updated
    for _ in range(2):
        for inputs, labels in _dataset(spec, folder, manifest["train"], specs):
            step(inputs, labels)
    scores, truth = [], []
    for inputs, labels in _dataset(spec, folder, manifest["test"], specs):
        scores.append(model(inputs).numpy())
        truth.append(labels.numpy())
    auc = task_metrics("binary", np.concatenate(scores), np.concatenate(truth))["auc"]
    # 6,000 held-out rows (~21 % positive): AUC's standard error at chance is sqrt((n1 + n0 + 1) / (12 n1 n0))
    # ~ 0.009, so 0.58 is far beyond chance; the planted logit the labels were drawn from bounds it above.
    assert 0.58 < auc <= manifest["planted_auc"] + 0.02, (auc, manifest["planted_auc"])


@pytest.mark.parametrize(("task", "output", "width"), [("classification", "logits", 3), ("binary", "probability", 1),
                                                       ("regression", "prediction", 1)])
def test_tabular_heads_follow_the_task(task, output, width):
    from tfship.pipeline.training.multi_input import tabular, task_keras_metrics, task_loss

    specs = input_specs(_data(price={"shape": [3]}, store={"dtype": "int64", "kind": "categorical", "num_ids": 10}))
    model = tabular(specs, task, num_classes=3)
    assert model.output_names == [output] and model.outputs[0].shape[-1] == width
    assert [m.name for m in task_keras_metrics(task)][0] == primary(task).name
    assert task_loss(task) is not None
    with pytest.raises(ValueError, match="expected one of"):
        tabular(specs, "ranking")


def _traced_ops(layer_class) -> set[str]:
    import keras
    import tensorflow as tf

    ids = keras.Input((), dtype="int64", name="user_id")
    model = keras.Model(ids, keras.layers.Dense(1)(layer_class(1000, 4, name="table")(ids)))
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x, training=True) ** 2)
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    graph = step.get_concrete_function(tf.TensorSpec([None], tf.int64)).graph.as_graph_def()
    return {node.op for node in [*graph.node, *(n for f in graph.library.function for n in f.node_def)]}


def test_sparse_embedding_reads_and_writes_only_the_batch_rows_and_reloads(tmp_path):
    import keras

    from tfship.pipeline.training.sparse_embedding import SparseEmbedding

    ours, keras_own = _traced_ops(SparseEmbedding), _traced_ops(keras.layers.Embedding)
    assert {"ResourceGather", "ResourceScatterSub"} <= ours
    assert "ResourceGather" not in keras_own  # Keras' own lookup reads the whole table (then copies it on write)
    ids = keras.Input((3,), dtype="int64", name="history")
    model = keras.Model(ids, SparseEmbedding(50, 4, mask_zero=True, name="table")(ids))
    plain = keras.layers.Embedding(50, 4, mask_zero=True)
    plain.build((None, 3))
    plain.set_weights(model.get_layer("table").get_weights())
    batch = np.array([[1, 2, 0], [49, 0, 0]])
    np.testing.assert_array_equal(model.predict(batch, verbose=0), plain(batch).numpy())
    np.testing.assert_array_equal(model.get_layer("table").compute_mask(batch).numpy(), batch != 0)
    model.save(tmp_path / "m.keras")
    np.testing.assert_array_equal(keras.models.load_model(tmp_path / "m.keras").predict(batch, verbose=0),
                                  model.predict(batch, verbose=0))


def test_an_all_padding_sequence_trains_without_nan():
    import keras
    import tensorflow as tf

    from tfship.pipeline.training.multi_input import tabular, task_loss
    from tfship.pipeline.training.sparse_embedding import MaskedMean

    vectors = tf.constant(np.ones((2, 3, 4), np.float32))
    mask = tf.constant([[True, True, False], [False, False, False]])
    with tf.GradientTape() as tape:
        tape.watch(vectors)
        pooled = MaskedMean()(vectors, mask=mask)
    assert pooled.numpy().tolist() == [[1.0] * 4, [0.0] * 4]
    assert np.isfinite(tape.gradient(pooled, vectors).numpy()).all()
    specs = input_specs(_data(price={"shape": [2]}, clicks={"dtype": "int64", "kind": "sequence", "num_ids": 9,
                                                            "length": 3}))
    model = tabular(specs, "regression")
    model.compile(keras.optimizers.Adam(1e-2), task_loss("regression"))
    x = {"price": np.ones((4, 2), np.float32), "clicks": np.array([[1, 2, 0], [0, 0, 0], [3, 0, 0], [0, 0, 0]])}
    model.fit(x, np.arange(4, dtype=np.float32), epochs=2, verbose=0)
    assert all(np.isfinite(w).all() for w in model.get_weights())


def test_a_saved_multi_input_model_loads_in_a_fresh_process(tmp_path):
    """`tfship run --model m.keras` (and a resumed ship) loads tfship's own layers without --custom-objects."""
    import subprocess
    import sys

    from tfship.pipeline.training.multi_input import tabular

    specs = input_specs(_data(store={"dtype": "int64", "kind": "categorical", "num_ids": 5},
                              clicks={"dtype": "int64", "kind": "sequence", "num_ids": 9, "length": 3}))
    tabular(specs, "binary").save(tmp_path / "m.keras")
    code = ("import sys; from tfship.pipeline.export_only.user_model import load_user_model; "
            "print(sorted(t.name for t in load_user_model(sys.argv[1]).inputs))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.keras")], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "['clicks', 'store']"


def test_export_alone_loads_a_trained_text_model_in_a_fresh_process(tmp_path):
    """`tfship export` after `tfship train` reads `<run>/model.keras`; the text model's `SparseEmbedding` loads."""
    import subprocess
    import sys

    from tfship.pipeline.config import ModelSection
    from tfship.pipeline.training.model import build_model

    model = build_model(ModelSection(kind="text", vocab_size=50, embedding_dim=4), (6,), 2, 0, input_name="tokens",
                        input_dtype="int32")
    assert type(model.get_layer("embedding")).__name__ == "SparseEmbedding"
    model.save(tmp_path / "model.keras")
    code = ("import sys, keras; from pathlib import Path; from tfship.pipeline.orchestration import steps; "
            "from tfship.pipeline.config import PipelineConfig; from tfship.pipeline.orchestration.stages import "
            "RunFolder\ntry:\n    steps.export_stage(PipelineConfig(), RunFolder(Path(sys.argv[1])), None)\n"
            "except Exception as err:\n    print(type(err).__name__, str(err)[:300])")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert "Could not locate class" not in done.stdout + done.stderr, done.stdout[-2000:] + done.stderr[-2000:]

"""`build_task_model` for every kind x task over `DatasetSplits` (heads, shapes, preprocessing inside the model:
Normalization of dense inputs, StringLookup of raw strings), the factory's call signatures, refusals about a
setting itself, and `write_held_out` for one-input and named splits.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfship.core.errors import ConfigError
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.data.input_spec import InputSpec
from tfship.pipeline.data.split_types import ArraySplit, DatasetSplits
from tfship.pipeline.training.model import build_task_model

HEADS = {"classification": ("logits", 3), "binary": ("probability", 1), "regression": ("prediction", 1)}
CLASS_NAMES = {"classification": ("a", "b", "c"), "binary": ("0", "1"), "regression": ()}


def labels_for(task: str, rows: int) -> np.ndarray:
    if task == "regression":
        return np.linspace(0, 1, rows).astype(np.float32)
    return (np.arange(rows) % (3 if task == "classification" else 2)).astype(np.int64)


def one_input_splits(kind: str, task: str, rows: int = 24) -> DatasetSplits:
    rng = np.random.default_rng(0)
    images = {"cnn": rng.random((rows, 8, 8, 1), dtype=np.float32), "mlp": rng.random((rows, 5), dtype=np.float32),
              "text": rng.integers(0, 20, (rows, 6)).astype(np.int32)}[kind]
    split = ArraySplit(images, labels_for(task, rows))
    return DatasetSplits(split, split, split, CLASS_NAMES[task], "tokens" if kind == "text" else "image",
                         task=task, sample_size=10)


SPECS = (InputSpec("price", "price", "dense", "float32", (2,), "float32"),
         InputSpec("age", "age", "dense", "float32", (), "float32"),
         InputSpec("country", "country", "categorical", "string", (), "string", ("de", "fr", "it"), 4),
         InputSpec("user_id", "user_id", "categorical", "int64", (), "int64", (), 10),
         InputSpec("item_id", "item_id", "categorical", "int64", (), "int64", (), 12),
         InputSpec("history", "history", "sequence", "int64", (4,), "int64", (), 12))


def named_data(task: str, rows: int = 24) -> DatasetSplits:
    rng = np.random.default_rng(1)
    inputs = {"price": (rng.normal(size=(rows, 2)) * [100.0, 1.0] + [1000.0, 5.0]).astype(np.float32),
              "age": rng.uniform(20, 70, rows).astype(np.float32),
              "country": np.array([b"de", b"fr", b"it", b"xx"] * (rows // 4), dtype=object),
              "user_id": rng.integers(0, 10, rows), "item_id": rng.integers(0, 12, rows),
              "history": rng.integers(0, 12, (rows, 4))}
    split = ArraySplit(inputs, labels_for(task, rows))
    return DatasetSplits(split, split, split, CLASS_NAMES[task], task=task, specs=SPECS, sample_size=10)


def cfg(kind: str, task: str, **model) -> PipelineConfig:
    return PipelineConfig.model_validate({"model": {"kind": kind, "task": task, "hidden_units": [8], "filters": [4],
                                                    "dense_units": 8, "embedding_dim": 4, "vocab_size": 20, **model},
                                          "run": {"seed": 5}})


def feed(splits: DatasetSplits, rows: int = 6):
    images = splits.train.images
    if isinstance(images, dict):
        import tensorflow as tf

        return {k: tf.constant(v[:rows].astype(bytes) if v.dtype == object else v[:rows]) for k, v in images.items()}
    return images[:rows]


@pytest.mark.parametrize("task", ["classification", "binary", "regression"])
@pytest.mark.parametrize("kind", ["cnn", "mlp", "text", "tabular", "recommender"])
def test_every_kind_and_task_builds_with_the_task_head(kind, task):
    splits = named_data(task) if kind in ("tabular", "recommender") else one_input_splits(kind, task)
    model = build_task_model(cfg(kind, task), splits)
    head, width = HEADS[task]
    assert model.layers[-1].name == head
    outputs = np.asarray(model(feed(splits), training=False))
    assert outputs.shape == (6, width) and outputs.dtype == np.float32
    if task == "binary":
        assert ((outputs >= 0) & (outputs <= 1)).all()  # a sigmoid probability
    if kind in ("tabular", "recommender"):
        assert model.inputs[[t.name for t in model.inputs].index("country")].dtype == "string"  # raw strings in


def test_run_seed_seeds_the_weights_of_the_named_kinds():
    first = build_task_model(cfg("recommender", "binary"), named_data("binary"))
    again = build_task_model(cfg("recommender", "binary"), named_data("binary"))
    seeded = cfg("recommender", "binary")
    other = build_task_model(seeded.model_copy(update={"run": seeded.run.model_copy(update={"seed": 6})}),
                             named_data("binary"))
    assert all(np.array_equal(a, b) for a, b in zip(first.get_weights(), again.get_weights(), strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first.get_weights(), other.get_weights(), strict=True))


def test_the_string_lookup_inside_the_model_maps_raw_strings_and_unknowns():
    import tensorflow as tf

    model = build_task_model(cfg("tabular", "binary"), named_data("binary"))
    lookup = model.get_layer("country_lookup")
    assert lookup.__class__.__name__ == "StringLookup"
    assert lookup(tf.constant(["de", "it", "nowhere"])).numpy().tolist() == [1, 3, 0]  # 1 + index; unknown 0
    assert model.get_layer("country_embedding").input_dim == 4


def test_normalize_adapts_each_dense_input_on_the_train_sample():
    splits = named_data("regression")
    model = build_task_model(cfg("tabular", "regression", normalize=True), splits)
    price = model.get_layer("price_normalize")
    mean = np.asarray(price.mean).reshape(-1)
    assert mean == pytest.approx(splits.train.images["price"].mean(axis=0), rel=1e-4)
    age = model.get_layer("age_normalize")
    assert float(np.asarray(age.mean).reshape(-1)[0]) == pytest.approx(splits.train.images["age"].mean(), rel=1e-4)
    plain = build_task_model(cfg("tabular", "regression"), splits)
    assert "price_normalize" not in [layer.name for layer in plain.layers]


def test_settings_that_mean_nothing_for_the_kind_are_refused_naming_the_setting():
    with pytest.raises(ConfigError, match=r"model.normalize = true: model.kind = 'text' takes token ids"):
        build_task_model(cfg("text", "binary", normalize=True), one_input_splits("text", "binary"))
    with pytest.raises(ConfigError, match=r"model.normalize = true: model.factory = "):
        build_task_model(cfg("mlp", "binary", normalize=True, factory="tests.pipeline.user_models:tiny"),
                         one_input_splits("mlp", "binary"))
    with pytest.raises(ConfigError, match=r"model.recompute: no layer named \['nope'\]"):
        build_task_model(cfg("tabular", "binary", recompute=["nope"]), named_data("binary"))


def test_recompute_and_mixed_precision_apply_to_the_named_kinds():
    model = build_task_model(cfg("tabular", "binary", recompute=["dense0"]), named_data("binary"))
    assert model.get_layer("dense0").__class__.__name__ == "Recompute"
    config = cfg("recommender", "regression")
    config = config.model_copy(update={"train": config.train.model_copy(update={"mixed_precision": "mixed_bfloat16"})})
    mixed = build_task_model(config, named_data("regression"))
    assert mixed.get_layer("dense0").dtype_policy.name == "mixed_bfloat16"
    assert mixed.get_layer("prediction").dtype_policy.name == "float32"
    assert np.asarray(mixed(feed(named_data("regression")), training=False)).dtype == np.float32


def factory_one(input_shape, num_classes, task="classification", width=4):
    import keras

    inputs = keras.Input(shape=input_shape, name="image")
    hidden = keras.layers.Dense(width)(keras.layers.Flatten()(inputs))
    units = num_classes if task == "classification" else 1
    return keras.Model(inputs, keras.layers.Dense(units, name=f"{task}_out")(hidden))


def factory_named(specs, task, num_classes, width=4):
    import keras

    inputs = {s.name: keras.Input(shape=s.shape, name=s.name, dtype=s.dtype) for s in specs if s.dtype == "float32"}
    parts = [keras.layers.Reshape((-1,))(t) for t in inputs.values()]
    hidden = keras.layers.Dense(width)(keras.layers.Concatenate()(parts))
    return keras.Model(inputs, keras.layers.Dense(num_classes if task == "classification" else 1,
                                                  name=f"{task}_out")(hidden))


def test_a_factory_gets_the_task_and_for_named_data_the_specs():
    one = build_task_model(cfg("mlp", "regression", factory=f"{__name__}:factory_one", factory_args={"width": 3}),
                           one_input_splits("mlp", "regression"))
    assert one.layers[-1].name == "regression_out" and one.layers[-2].units == 3
    named = build_task_model(cfg("tabular", "classification", factory=f"{__name__}:factory_named"),
                             named_data("classification"))
    assert sorted(t.name for t in named.inputs) == ["age", "price"] and named.output_shape == (None, 3)


def test_write_held_out_writes_one_array_per_input_and_y(tmp_path):
    from tfship.pipeline.data.held_out import write_held_out

    named = named_data("binary")
    path = write_held_out(named, tmp_path / "held_out.npz")
    with np.load(path) as saved:
        assert sorted(saved.files) == sorted([s.name for s in SPECS] + ["y"])
        assert saved["price"].shape == (10, 2) and saved["y"].tolist() == named.test.labels[:10].tolist()
        assert saved["country"].tolist()[:4] == ["de", "fr", "it", "xx"]  # strings as text, not bytes reprs
    assert not list(tmp_path.glob("*.partial*"))
    one = one_input_splits("cnn", "regression")
    with np.load(write_held_out(one, tmp_path / "one.npz")) as saved:
        assert sorted(saved.files) == ["image", "y"] and saved["image"].shape == (10, 8, 8, 1)
        assert saved["y"].dtype == np.float32

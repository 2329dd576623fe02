"""The check that a config can be trained before data is read, and the named model inputs it declares.

`InputSpec` and `input_specs` (the feature spec as named inputs) live in `pipeline.data.input_spec` (the data
layer builds the splits from them) and are re-exported here. Every kind (cnn, mlp, text, tabular, recommender,
a factory) trains every task (classification, binary, regression) from every source through one loop;
`check_trainable` refuses only settings that cannot mean anything, each with one line naming the key and value.
"""

from __future__ import annotations

from tfship.core.errors import ConfigError
from tfship.pipeline.data.input_spec import InputSpec, input_specs, model_inputs, parse_spec

__all__ = ["NAMED_KINDS", "InputSpec", "check_trainable", "feature_parse_spec", "input_specs", "is_named",
           "parse_batch"]

NAMED_KINDS = ("tabular", "recommender")
STREAMING = ("tfrecord", "csv", "image_folder")


def is_named(config) -> bool:
    """Whether `config` exports through the named-input (held-out NPZ) path: a tabular or recommender model, or
    a task other than classification.
    """
    return config.model.kind in NAMED_KINDS or config.model.task != "classification"


def check_trainable(config) -> tuple[InputSpec, ...]:
    """Refuse a config `tfship train` cannot train, before any data is read; return its declared named inputs
    (TFRecord feature spec; () otherwise: a CSV's inputs come from its header).

    Raises:
        ConfigError: one line naming the key and the value: a feature spec that is no model input
            (`input_specs`), several (or non-dense) inputs for a cnn, mlp or text model, a ragged sequence, a
            named-input model over TFRecord without a feature spec, a float label for classification, an image
            folder for regression, `model.normalize` for a text model or a factory, declared split sizes
            (`data.split_sizes`) for an in-memory source or without the class names or string vocabularies
            the skipped scan would have found.
    """
    data, model = config.data, config.model
    _check_model(model)
    specs: tuple[InputSpec, ...] = ()
    if data.source == "tfrecord" and (data.feature_spec or model.kind in NAMED_KINDS):
        if not data.feature_spec:
            raise ConfigError(f"data.feature_spec = {{}}: model.kind = {model.kind!r} reads named inputs from "
                              "tf.Examples; declare their features")
        specs = input_specs(data)
    if model.kind in NAMED_KINDS:
        for spec in specs:
            if spec.ragged:
                raise ConfigError(f"data.feature_spec.{spec.feature}.ragged = true: the {model.kind} model takes "
                                  f"padded sequences; declare data.feature_spec.{spec.feature}.length = N instead")
    elif len(specs) > 1 or any(spec.kind != "dense" for spec in specs):
        described = ", ".join(f"{spec.feature} ({spec.kind})" for spec in specs)
        raise ConfigError(f"model.kind = {model.kind!r}: data.feature_spec declares {len(specs)} model inputs "
                          f"[{described}] and {model.kind} takes one dense input; set model.kind = 'tabular' (or "
                          "'recommender') for several named inputs (a model.factory then gets them as specs=)")
    label = data.feature_spec.get(data.label) if data.source == "tfrecord" else None
    if label is not None and label.dtype == "float32" and model.task == "classification":
        raise ConfigError(f"data.feature_spec.{data.label}.dtype = 'float32': model.task = 'classification' takes "
                          "class labels (int64 or string); float labels are model.task = 'regression'")
    if data.source == "image_folder" and model.task == "regression":
        raise ConfigError("model.task = 'regression': data.source = 'image_folder' labels images by class folder, "
                          "not by a number")
    _check_declared_sizes(config, specs)
    return specs


def _check_model(model) -> None:
    if model.normalize and model.factory is not None:
        raise ConfigError(f"model.normalize = true: model.factory = {model.factory!r} builds its own layers; "
                          "normalize inside the factory")
    if model.normalize and model.kind == "text":
        raise ConfigError("model.normalize = true: model.kind = 'text' takes token ids, which are not "
                          "quantities to normalize")


def _check_declared_sizes(config, specs) -> None:
    data, task = config.data, config.model.task
    if not data.split_sizes:
        return
    if data.source not in STREAMING:
        raise ConfigError(f"data.split_sizes: data.source = {data.source!r} is split in memory (its sizes are "
                          "known); declared sizes are for the streaming sources (tfrecord, csv, image_folder)")
    if task == "classification" and not data.classes and data.source != "image_folder":
        raise ConfigError("data.classes = []: data.split_sizes skips the counted pass that would find the class "
                          "names; declare data.classes")
    for spec in specs:
        if spec.needs_vocabulary:
            raise ConfigError(f"data.feature_spec.{spec.feature}.vocabulary = []: data.split_sizes skips the counted "
                              "pass that would find its values; declare the vocabulary")
    for column, values in data.categorical.items():
        if data.source == "csv" and not values:
            raise ConfigError(f"data.categorical.{column} = []: data.split_sizes skips the counted pass that would "
                              "find its values; declare them")


def feature_parse_spec(specs: tuple[InputSpec, ...], label: str | None = None, label_dtype: str = "int64") -> dict:
    """`tf.io.parse_example`'s feature dict for `specs` (sequences as `RaggedFeature`) and the label."""
    import tensorflow as tf

    parse = parse_spec(specs)
    if label is not None:
        parse[label] = tf.io.FixedLenFeature([], tf.as_dtype(label_dtype))
    return parse


def parse_batch(specs: tuple[InputSpec, ...], label: str, label_dtype: str = "int64"):
    """A tf.data map function: serialized tf.Examples string [B] -> ({input name: [B, ...]}, labels [B]): dense
    float32, ids int64, string inputs raw (`pipeline.data.input_spec.model_inputs`).
    """
    import tensorflow as tf

    parse = feature_parse_spec(specs, label, label_dtype)

    def parse_records(records):
        parsed = tf.io.parse_example(records, parse)
        return model_inputs(specs, parsed), parsed[label]

    return parse_records

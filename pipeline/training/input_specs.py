"""The feature spec as named model inputs, and the check that a config can be trained before data is read.

`data.feature_spec` declares tf.Example features; every feature other than the label becomes one named
model input (`InputSpec`), which is one input of the exported signature:

* dense: float32 (or int64) values of the declared fixed `shape` -> input [B, *shape] float32;
* categorical: one id per example -> input [B] int64; int64 ids in [0, num_ids), or strings looked up in
  `vocabulary` (id 1 + index; 0 for an unknown value), so the embedding table has num_ids rows;
* sequence: a variable number of ids per example -> input [B, length] int64, padded with 0 (and cut) to
  the declared `length`, or a ragged [B, None] int64 input with `ragged = true`.

`parse_inputs` turns a batch of serialized tf.Examples into those inputs inside tf.data (one vectorised
`tf.io.parse_example`, TensorFlow's "batch, then parse").
"""

from __future__ import annotations

from dataclasses import dataclass

from tfship.core.errors import ConfigError


@dataclass(frozen=True)
class InputSpec:
    """One named model input.

    Attributes:
        name: the model (and signature) input name.
        feature: the tf.Example feature it is parsed from.
        kind: "dense" | "categorical" | "sequence".
        dtype: the model input dtype: "float32" (dense) or "int64" (ids).
        shape: per-example shape: dense the declared shape, categorical (), sequence (length,) or (None,).
        feature_dtype: the feature's dtype in the tf.Example ("float32" | "int64" | "string").
        vocabulary: string ids: the known values.
        num_ids: ids lie in [0, num_ids) (categorical and sequence; the embedding table's rows).
        ragged: a sequence fed as a tf.RaggedTensor.
    """

    name: str
    feature: str
    kind: str
    dtype: str
    shape: tuple
    feature_dtype: str
    vocabulary: tuple[str, ...] = ()
    num_ids: int = 0
    ragged: bool = False


def input_specs(data) -> tuple[InputSpec, ...]:
    """The named model inputs a `DataSection`'s `feature_spec` declares (the label left out), in `data.features`
    order when given, else in declaration order.

    Raises:
        ConfigError: one line naming the key (`data.feature_spec.<name>.<field>` or `data.features`) and the
            value: a listed feature without a spec, a string dense feature, a float id, ids without
            `num_ids` or `vocabulary`, a sequence with neither `length` nor `ragged`.
    """
    spec = dict(data.feature_spec)
    names = list(data.features) or [n for n in spec if n != data.label]
    for name in names:
        if name not in spec:
            raise ConfigError(f"data.features: {name!r} has no entry in data.feature_spec {sorted(spec)}")
    return tuple(_one(name, spec[name]) for name in names)


def _one(name: str, feature) -> InputSpec:
    key = f"data.feature_spec.{name}"
    input_name = feature.input_name or name
    if feature.kind == "dense":
        if feature.dtype == "string":
            raise ConfigError(f"{key}.dtype = 'string': a dense input is numeric; declare kind = 'categorical' "
                              "with a vocabulary")
        return InputSpec(input_name, name, "dense", "float32", tuple(feature.shape), feature.dtype)
    if feature.dtype == "float32":
        raise ConfigError(f"{key}.dtype = 'float32': {feature.kind} ids are int64 or string")
    if feature.dtype == "string" and not feature.vocabulary:
        raise ConfigError(f"{key}.vocabulary = []: string ids need their vocabulary declared")
    if feature.dtype == "int64" and feature.num_ids is None:
        raise ConfigError(f"{key}.num_ids = None: int64 ids need the id range [0, num_ids) declared")
    num_ids = len(feature.vocabulary) + 1 if feature.dtype == "string" else int(feature.num_ids)
    if feature.kind == "categorical":
        if feature.shape not in ((), (1,)):
            raise ConfigError(f"{key}.shape = {list(feature.shape)}: a categorical input holds one id; use "
                              "kind = 'sequence' for several")
        return InputSpec(input_name, name, "categorical", "int64", (), feature.dtype, tuple(feature.vocabulary),
                         num_ids)
    if feature.length is None and not feature.ragged:
        raise ConfigError(f"{key}.length = None: a sequence is padded to a declared length, or set ragged = true")
    shape = (None,) if feature.ragged else (int(feature.length),)
    return InputSpec(input_name, name, "sequence", "int64", shape, feature.dtype, tuple(feature.vocabulary),
                     num_ids, feature.ragged)


NAMED_KINDS = ("tabular", "recommender")
HASH_BUCKETS = 10_000
# Settings of the custom loop that the named-input path (Keras `fit`) does not carry: key -> its default.
LOOP_ONLY = {"train.strategy": "default", "train.step.kind": "standard", "train.accumulation_steps": 1,
             "train.freeze": (), "train.early_stopping_patience": None, "train.check_numerics": False,
             "train.assert_inputs": False, "model.recompute": (), "model.normalize": False, "model.factory": None,
             "data.split_key": None, "data.skip_corrupt": False, "data.stream_cache": "none"}


def is_named(config) -> bool:
    """Whether `config` trains through the named-input path (a tabular or recommender model, or a task other
    than classification).
    """
    return config.model.kind in NAMED_KINDS or config.model.task != "classification"


def _setting(config, dotted: str):
    value = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def check_named(config) -> tuple[InputSpec, ...]:
    """Refuse a named-input config this path cannot train, before any data is read; return its inputs.

    Raises:
        ConfigError: one line naming the key and the value: a task for a one-input built-in model, a source
            other than tfrecord, no feature spec, a bad spec (`input_specs`), a ragged sequence, a string or
            float label for a classifier, classification without `data.classes`, or a custom-loop setting.
    """
    model, data = config.model, config.data
    if model.kind not in NAMED_KINDS:
        raise ConfigError(f"model.task = {model.task!r}: model.kind = {model.kind!r} is a one-input classifier; set "
                          "model.kind = 'tabular' (or 'recommender') with data.feature_spec")
    if data.source != "tfrecord":
        raise ConfigError(f"data.source = {data.source!r}: model.kind = {model.kind!r} reads named inputs from "
                          "tf.Examples (data.source = 'tfrecord' with data.feature_spec)")
    if not data.feature_spec:
        raise ConfigError(f"data.feature_spec = {{}}: model.kind = {model.kind!r} needs its named inputs declared")
    specs = input_specs(data)
    for spec in specs:
        if spec.ragged:
            raise ConfigError(f"data.feature_spec.{spec.feature}.ragged = true: the {model.kind} model takes padded "
                              f"sequences; declare data.feature_spec.{spec.feature}.length = N instead")
    label = data.feature_spec.get(data.label)
    label_dtype = label.dtype if label is not None else ("float32" if model.task == "regression" else "int64")
    if label_dtype == "string" or (label_dtype == "float32" and model.task != "regression"):
        raise ConfigError(f"data.feature_spec.{data.label}.dtype = {label_dtype!r}: model.task = {model.task!r} "
                          "takes int64 labels (class ids; 0/1 for binary)")
    if model.task == "classification" and len(data.classes) < 2:
        raise ConfigError(f"data.classes = {list(data.classes)}: model.task = 'classification' with named inputs "
                          "needs the class names declared (class id = index)")
    if data.path is None and None in (data.train_path, data.validation_path, data.test_path):
        raise ConfigError("data.path = None: give data.path (hash split) or all of data.train_path, "
                          "data.validation_path and data.test_path")
    for dotted, default in LOOP_ONLY.items():
        value = _setting(config, dotted)
        if value != default:
            raise ConfigError(f"{dotted} = {value!r}: not available with model.kind = {model.kind!r} (named inputs "
                              f"train with Keras fit in one process); leave it at {default!r}")
    return specs


def check_trainable(config) -> tuple[InputSpec, ...]:
    """Refuse a config `tfship train` cannot train, before any data is read; return its named inputs.

    A tabular or recommender model, or a task other than classification, goes through the named-input path
    (`check_named`: every input kind padded, every task). The built-in cnn, mlp
    and text models and the custom loop take one dense input and class-id labels.

    Raises:
        ConfigError: one line naming the key and the value: what `check_named` refuses, a feature spec that
            does not describe model inputs (`input_specs`), or several inputs (or a categorical / sequence
            input) for a cnn, mlp or text model.
    """
    if is_named(config):
        return check_named(config)
    data, model = config.data, config.model
    if data.source != "tfrecord" or not data.feature_spec:
        return ()
    specs = input_specs(data)
    if len(specs) > 1 or any(spec.kind != "dense" for spec in specs):
        described = ", ".join(f"{spec.feature} ({spec.kind})" for spec in specs)
        raise ConfigError(f"model.kind = {model.kind!r}: data.feature_spec declares {len(specs)} model inputs "
                          f"[{described}] and {model.kind} takes one dense input; set model.kind = 'tabular' (or "
                          "'recommender') for several named inputs")
    return specs


def feature_parse_spec(specs: tuple[InputSpec, ...], label: str | None = None, label_dtype: str = "int64") -> dict:
    """`tf.io.parse_example`'s feature dict for `specs` (sequences as `RaggedFeature`) and the label."""
    import tensorflow as tf

    parse = {}
    for spec in specs:
        dtype = tf.as_dtype(spec.feature_dtype)
        if spec.kind == "sequence":
            parse[spec.feature] = tf.io.RaggedFeature(dtype)
        else:
            parse[spec.feature] = tf.io.FixedLenFeature(list(spec.shape), dtype)
    if label is not None:
        parse[label] = tf.io.FixedLenFeature([], tf.as_dtype(label_dtype))
    return parse


def model_inputs(specs: tuple[InputSpec, ...], parsed: dict) -> dict:
    """{input name: tensor} from `parse_example`'s output: string ids looked up (1 + index, 0 unknown),
    sequences padded with 0 and cut to their length (or kept ragged), dense values float32.
    """
    import tensorflow as tf

    inputs = {}
    for spec in specs:
        value = parsed[spec.feature]
        if spec.vocabulary:
            table = tf.constant(list(spec.vocabulary))
            lookup = lambda texts, table=table: _vocabulary_ids(texts, table)  # noqa: E731
            value = tf.ragged.map_flat_values(lookup, value) if isinstance(value, tf.RaggedTensor) else lookup(value)
        if spec.kind == "sequence" and not spec.ragged:
            value = value.to_tensor(default_value=0, shape=[None, spec.shape[0]])
        inputs[spec.name] = tf.cast(value, tf.float32) if spec.kind == "dense" else value
    return inputs


def _vocabulary_ids(texts, table):
    """int64 ids of `texts` string [...]: 1 + the index in `table`, 0 when absent (a broadcast comparison:
    no stateful lookup table, so the dataset's iterator stays checkpointable).
    """
    import tensorflow as tf

    equal = tf.equal(tf.expand_dims(texts, -1), table)
    found = tf.reduce_any(equal, axis=-1)
    return tf.where(found, tf.argmax(tf.cast(equal, tf.int32), axis=-1, output_type=tf.int64) + 1,
                    tf.constant(0, tf.int64))


def parse_batch(specs: tuple[InputSpec, ...], label: str, label_dtype: str = "int64"):
    """A tf.data map function: serialized tf.Examples string [B] -> (named inputs, labels [B])."""
    import tensorflow as tf

    parse = feature_parse_spec(specs, label, label_dtype)

    def parse_records(records):
        parsed = tf.io.parse_example(records, parse)
        return model_inputs(specs, parsed), parsed[label]

    return parse_records

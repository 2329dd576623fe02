"""Named model inputs (`InputSpec`): what `data.feature_spec` (TFRecord) or a CSV header declares, and how a
batch of parsed features becomes those inputs inside tf.data.

* dense: float32 values of a fixed shape -> input float32 [B, *shape] (a CSV numeric column: shape ());
* categorical: one value per example -> int64 ids [B] in [0, num_ids) as declared, or **raw strings** [B]
  (the model maps them to ids with a `StringLookup` over `vocabulary`: 0 unknown, 1 + index otherwise);
* sequence: a variable number of values per example, padded (or cut) to `length`: int64 ids [B, length]
  (0 = padding), or raw strings [B, length] ("" = padding; the model's `StringLookup` maps "" to 0, an
  unknown value to 1, the vocabulary to 2 + index).

A string vocabulary is the declared `vocabulary`, else the values the counted pass (`pipeline.data.scan`)
found, at most `MAX_VOCABULARY` of them. Nothing here uses a `tf.lookup` table, so a dataset built from these
functions keeps a checkpointable iterator.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from tfship.core.errors import ConfigError

MAX_VOCABULARY = 10_000  # distinct values the scan collects for one string input
INPUT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class InputSpec:
    """One named model input.

    Attributes:
        name: the model (and signature) input name.
        feature: the tf.Example feature or CSV column it is read from.
        kind: "dense" | "categorical" | "sequence".
        dtype: the model input dtype: "float32" (dense), "int64" (ids) or "string" (raw strings).
        shape: per-example shape: dense the declared shape, categorical (), sequence (length,) or (None,).
        feature_dtype: the feature's dtype in the record ("float32" | "int64" | "string").
        vocabulary: string inputs: the known values (declared or found by the scan).
        num_ids: ids lie in [0, num_ids) (the embedding table's rows; strings: after the model's lookup).
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

    @property
    def needs_vocabulary(self) -> bool:
        """A string input whose vocabulary is still to be found by the scan."""
        return self.dtype == "string" and not self.vocabulary

    def with_vocabulary(self, values) -> InputSpec:
        """This spec with `values` as its vocabulary (and the id range that follows)."""
        values = tuple(values)
        return replace(self, vocabulary=values, num_ids=len(values) + (2 if self.kind == "sequence" else 1))


def input_name(column: str) -> str:
    """A valid model input name (`^[A-Za-z][A-Za-z0-9_]{0,63}$`) for a column or feature name: other characters
    become "_", a leading non-letter gets an "f_" prefix, cut to 64 characters ("mean radius" -> "mean_radius",
    "2nd" -> "f_2nd").
    """
    if INPUT_NAME.match(column):
        return column
    name = re.sub(r"[^A-Za-z0-9_]", "_", column)
    if not name or not name[0].isalpha():
        name = "f_" + name
    return name[:64]


def input_specs(data) -> tuple[InputSpec, ...]:
    """The named model inputs a `DataSection`'s `feature_spec` declares (the label left out), in `data.features`
    order when given, else in declaration order. A string input without a declared vocabulary comes back with
    `vocabulary = ()` (the scan fills it: `InputSpec.with_vocabulary`).

    Raises:
        ConfigError: one line naming the key (`data.feature_spec.<name>.<field>` or `data.features`) and the
            value: a listed feature without a spec, a string dense feature, a float id, int64 ids without
            `num_ids`, a categorical with a shape, a sequence with neither `length` nor `ragged`.
    """
    spec = dict(data.feature_spec)
    names = list(data.features) or [n for n in spec if n != data.label]
    for name in names:
        if name not in spec:
            raise ConfigError(f"data.features: {name!r} has no entry in data.feature_spec {sorted(spec)}")
    return tuple(_one(name, spec[name]) for name in names)


def _one(name: str, feature) -> InputSpec:
    key = f"data.feature_spec.{name}"
    model_name = feature.input_name or input_name(name)
    if feature.kind == "dense":
        if feature.dtype == "string":
            raise ConfigError(f"{key}.dtype = 'string': a dense input is numeric; declare kind = 'categorical' "
                              "(a vocabulary is optional: the scan finds it)")
        return InputSpec(model_name, name, "dense", "float32", tuple(feature.shape), feature.dtype)
    if feature.dtype == "float32":
        raise ConfigError(f"{key}.dtype = 'float32': {feature.kind} values are int64 ids or strings")
    if feature.dtype == "int64" and feature.num_ids is None:
        raise ConfigError(f"{key}.num_ids = None: int64 ids need the id range [0, num_ids) declared")
    dtype = "string" if feature.dtype == "string" else "int64"
    if feature.kind == "categorical":
        if feature.shape not in ((), (1,)):
            raise ConfigError(f"{key}.shape = {list(feature.shape)}: a categorical input holds one value; use "
                              "kind = 'sequence' for several")
        made = InputSpec(model_name, name, "categorical", dtype, (), feature.dtype, (), int(feature.num_ids or 0))
    else:
        shape: tuple[int | None, ...]
        if feature.ragged:
            shape = (None,)
        elif feature.length is None:
            raise ConfigError(f"{key}.length = None: a sequence is padded to a declared length, or set "
                              "ragged = true")
        else:
            shape = (int(feature.length),)
        made = InputSpec(model_name, name, "sequence", dtype, shape, feature.dtype, (), int(feature.num_ids or 0),
                         feature.ragged)
    return made.with_vocabulary(feature.vocabulary) if feature.vocabulary and dtype == "string" else made


def csv_specs(columns, categorical: Mapping[str, tuple[str, ...]]) -> tuple[InputSpec, ...]:
    """One input per CSV column: numeric columns dense float32 scalars, `categorical` columns raw strings
    (their vocabulary declared, or `()` for the scan to find). Input names: `input_name(column)`.

    Raises:
        ConfigError: two columns whose sanitized input names collide (naming both).
    """
    specs, seen = [], {}
    for column in columns:
        name = input_name(column)
        if name in seen:
            raise ConfigError(f"data.features: columns {seen[name]!r} and {column!r} both become model input "
                              f"{name!r}; rename one of them in the header")
        seen[name] = column
        if column in categorical:
            made = InputSpec(name, column, "categorical", "string", (), "string")
            specs.append(made.with_vocabulary(categorical[column]) if categorical[column] else made)
        else:
            specs.append(InputSpec(name, column, "dense", "float32", (), "float32"))
    return tuple(specs)


def parse_spec(specs: tuple[InputSpec, ...]) -> dict:
    """`tf.io.parse_example`'s feature dict for `specs` (sequences as `RaggedFeature`)."""
    import tensorflow as tf

    parse = {}
    for spec in specs:
        dtype = tf.as_dtype(spec.feature_dtype)
        if spec.kind == "sequence":
            parse[spec.feature] = tf.io.RaggedFeature(dtype)
        else:
            parse[spec.feature] = tf.io.FixedLenFeature(list(spec.shape), dtype)
    return parse


def model_inputs(specs: tuple[InputSpec, ...], parsed: Mapping) -> dict:
    """{input name: tensor} from parsed features: dense float32, ids int64, strings raw (sequences padded with
    0 / "" and cut to their length, or kept ragged).
    """
    import tensorflow as tf

    inputs = {}
    for spec in specs:
        value = parsed[spec.feature]
        if spec.kind == "sequence" and not spec.ragged:
            pad = "" if spec.dtype == "string" else 0
            value = value.to_tensor(default_value=pad, shape=[None, spec.shape[0]])
        inputs[spec.name] = tf.cast(value, tf.float32) if spec.kind == "dense" else value
    return inputs


def vocabulary_error(spec_feature: str, key: str, count: int) -> str:
    """The message for a string input with too many distinct values to collect."""
    return (f"{key}: more than {MAX_VOCABULARY:,} distinct values of {spec_feature!r} ({count:,} seen so far): too "
            "many to collect; declare its vocabulary (the values the model should know)")

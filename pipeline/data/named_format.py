"""`NamedFormat`: the record format of named model inputs (tabular, recommender), from TFRecord files of
tf.Example (one input per `data.feature_spec` entry) or CSV files with a header (one input per column), for
`pipeline.data.stream.StreamSplit`: so the hash split, `data.split_key`, `data.skip_corrupt`,
`data.stream_cache`, sharding and the counted pass (`pipeline.data.scan`) work for named inputs too.

`parse(batch)` returns ({input name: tensor [B, ...]}, labels string [B] or float32 [B]) from raw records
string [B] in one vectorised call (`tf.io.parse_example` or `tf.io.decode_csv`); shapes and dtypes per input
in `pipeline.data.input_spec`. String inputs stay raw strings (the model's `StringLookup` maps them to ids).

CSV columns: `data.features` (default: every column but `data.label`) in header order; numeric columns are
dense float32 scalars, the columns named in `data.categorical` are strings (their declared values, or the
values the scan finds when the list is empty). A column name that is not a valid input name becomes one
(`input_spec.input_name`: "mean radius" -> "mean_radius").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from tfship.core.errors import ConfigError, DatasetError
from tfship.pipeline.data.files import Compression
from tfship.pipeline.data.input_spec import InputSpec, csv_specs, input_specs, model_inputs, parse_spec


@dataclass(frozen=True)
class NamedFormat:
    """Named inputs of TFRecord (`kind = "tfrecord"`) or CSV (`kind = "csv"`) records.

    Attributes:
        specs: the model inputs, in order.
        label: the label feature or column; label_dtype its dtype in the record ("int64" | "float32" |
            "string"; CSV: "string").
        compression: TFRecord: "", "GZIP" or "ZLIB".
        header: CSV: every column of the header, in file order.
        key_dtypes: TFRecord scalar features usable as `data.split_key` -> dtype.
    """

    kind: str
    specs: tuple[InputSpec, ...]
    label: str
    label_dtype: str = "string"
    compression: Compression = ""
    header: tuple[str, ...] = ()
    key_dtypes: dict[str, str] = field(default_factory=dict)
    input_name: str = "features"
    dtype = "float32"
    named = True

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.specs)

    @property
    def example_shape(self) -> dict[str, tuple]:
        return {spec.name: tuple(spec.shape) for spec in self.specs}

    def empty_inputs(self) -> dict[str, np.ndarray]:
        """{input name: an empty array [0, *shape]} in each input's dtype."""
        return {s.name: np.zeros((0, *(d or 0 for d in s.shape)), object if s.dtype == "string" else s.dtype)
                for s in self.specs}

    def read(self, file):
        """A dataset of one file's raw records (scalar string): serialized tf.Examples, or CSV data lines."""
        import tensorflow as tf

        if self.kind == "csv":
            return tf.data.TextLineDataset(file, buffer_size=1 << 20).skip(1)
        return tf.data.TFRecordDataset(file, compression_type=self.compression, buffer_size=1 << 20)

    def parse(self, batch):
        """({input name: tensor [B, ...]}, labels string [B] | float32 [B]) of raw records string [B]."""
        import tensorflow as tf

        if self.kind == "csv":
            fields = self._columns(batch)
            return {s.name: fields[s.feature] for s in self.specs}, fields[self.label]
        spec = parse_spec(self.specs) | {self.label: tf.io.FixedLenFeature([], tf.as_dtype(self.label_dtype))}
        parsed = tf.io.parse_example(batch, spec)
        label = parsed[self.label]
        return model_inputs(self.specs, parsed), label if label.dtype != tf.int64 else tf.strings.as_string(label)

    def _columns(self, batch) -> dict:
        import tensorflow as tf

        strings = {self.label} | {s.feature for s in self.specs if s.dtype == "string"}
        wanted = strings | {s.feature for s in self.specs}
        names = [name for name in self.header if name in wanted]
        defaults = [tf.constant([], tf.string if n in strings else tf.float32) for n in names]
        values = tf.io.decode_csv(batch, defaults, select_cols=[self.header.index(n) for n in names])
        return dict(zip(names, values, strict=True))

    def raw_columns(self, batch) -> dict:
        """{feature: its string values (flat)} of the string inputs whose vocabulary the scan collects."""
        import tensorflow as tf

        open_specs = [s for s in self.specs if s.needs_vocabulary]
        if not open_specs:
            return {}
        if self.kind == "csv":
            fields = self._columns(batch)
            return {s.feature: fields[s.feature] for s in open_specs}
        parsed = tf.io.parse_example(batch, parse_spec(tuple(open_specs)))
        flat = {}
        for s in open_specs:
            value = parsed[s.feature]
            if isinstance(value, tf.RaggedTensor):
                flat[s.feature] = value.flat_values
            else:
                assert isinstance(value, tf.Tensor)  # parse_spec: dense and ragged features, never sparse
                flat[s.feature] = tf.reshape(value, [-1])
        return flat

    def vocabulary_key(self, feature: str) -> str:
        """The setting that declares `feature`'s vocabulary (named in errors)."""
        return f"data.categorical.{feature}" if self.kind == "csv" else f"data.feature_spec.{feature}.vocabulary"

    def with_vocabularies(self, found: Mapping[str, Sequence[str]]) -> NamedFormat:
        """This format with the scan's values as the vocabulary of each string input that declared none.

        Raises:
            DatasetError: a string input the scan found no value of.
        """
        specs = []
        for spec in self.specs:
            if spec.needs_vocabulary:
                values = tuple(found.get(spec.feature, ()))
                if not values:
                    raise DatasetError(f"{self.vocabulary_key(spec.feature)}: no value found in the data to build "
                                       "the vocabulary from; declare it")
                spec = spec.with_vocabulary(values)
            specs.append(spec)
        return replace(self, specs=tuple(specs))

    def split_keys(self, batch, key: str):
        """The split key (`data.split_key`) of raw records [B] as strings [B]."""
        import tensorflow as tf

        if self.kind == "csv":
            if key not in self.header:
                raise DatasetError(f"data.split_key: no column {key!r}; the header has {list(self.header)}")
            (values,) = tf.io.decode_csv(batch, [tf.constant([], tf.string)], select_cols=[self.header.index(key)])
            return values
        dtype = self.key_dtypes.get(key)
        if dtype is None:
            raise DatasetError(f"data.split_key: {key!r} needs a scalar entry in data.feature_spec (int64 or string)")
        value = tf.io.parse_example(batch, {key: tf.io.FixedLenFeature([], tf.as_dtype(dtype))})[key]
        return value if value.dtype == tf.string else tf.strings.as_string(value)

    def where(self, index: int, offset: int | None) -> str:
        """A record's place: a CSV line (the header is line 1), or a TFRecord record number and byte offset."""
        if self.kind == "csv":
            return f"line {index + 2}"
        return f"record {index + 1}" + (f" (byte offset {offset})" if offset is not None else "")


def named_tfrecord_format(config, files: Sequence[str], task: str) -> NamedFormat:
    """The `NamedFormat` of a `DataSection` over TFRecord `files` (`data.feature_spec`, `data.label`).

    Raises:
        ConfigError: no feature spec, a bad spec (`input_spec.input_specs`). DatasetError: files of several
            compressions under `data.compression = "auto"`.
    """
    from tfship.pipeline.data.files import compression_of

    if not config.feature_spec:
        raise ConfigError("data.feature_spec = {}: named inputs from TFRecord files need their features declared")
    kinds: set[Compression] = {compression_of(f, config.compression) for f in files}
    if len(kinds) > 1:
        raise DatasetError(f"data.compression: the files mix compressions {sorted(k or 'none' for k in kinds)} "
                           "(by suffix); give one kind of file, or set data.compression")
    spec = dict(config.feature_spec)
    label = spec.get(config.label)
    label_dtype = label.dtype if label is not None else ("float32" if task == "regression" else "int64")
    return NamedFormat("tfrecord", input_specs(config), config.label, label_dtype, kinds.pop() if kinds else "",
                       key_dtypes={n: s.dtype for n, s in spec.items() if not s.shape and s.dtype != "float32"})


def named_csv_format(config, first_file: str) -> NamedFormat:
    """The `NamedFormat` of a `DataSection` over CSV files, the header read from `first_file`'s first line.

    Raises:
        DatasetError: an unreadable header, or a feature, categorical or label column the header lacks.
        ConfigError: two columns whose input names collide.
    """
    from tfship.pipeline.data.formats import csv_columns

    header, columns = csv_columns(config, first_file)
    return NamedFormat("csv", csv_specs(columns, dict(config.categorical)), config.label, "string",
                       header=header)

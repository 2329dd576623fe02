"""Record formats of the streaming sources: how a file becomes a dataset of raw records, and how a batch of
raw records is parsed at once (vectorised, inside tf.data).

* `TFRecordFormat`: records are serialized `tf.Example`s (`TFRecordDataset`, GZIP / ZLIB); a batch is
  parsed with one `tf.io.parse_example` (TensorFlow's own "batch, then parse" advice, tf.data guide).
* `CsvFormat`: records are text lines after the header (`TextLineDataset.skip(1)`); a batch is parsed with
  one `tf.io.decode_csv` (numeric columns float32, categorical columns one-hot, the label a string).
* `ImageFormat` lives in `pipeline.data.images` (decoding is per image: JPEGs differ in size).

`parse(batch)` returns (inputs [B, ...], label texts string [B]); label texts become class ids through the
class-name table (`pipeline.data.stream`). A record that does not parse makes `parse` raise
`InvalidArgumentError`; the scan (`pipeline.data.scan`) then finds and names the record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tfship.core.errors import DatasetError
from tfship.pipeline.data.files import Compression

TFRECORD_FRAMING_BYTES = 16  # length (8) + length CRC (4) + data CRC (4) around each record's bytes


@dataclass(frozen=True)
class TFRecordFormat:
    """tf.Example records with a declared feature spec.

    Attributes:
        feature: the input feature (its name, dtype "float32" | "int64", fixed shape).
        label: the label feature (int64 class id text or string class name).
        label_dtype: "int64" or "string".
        compression: TFRecordDataset's compression_type of every file: "", "GZIP" or "ZLIB".
        input_name: the model input name.
    """

    feature: str
    dtype: str
    shape: tuple[int, ...]
    label: str
    label_dtype: str
    compression: Compression
    input_name: str
    kind: str = "tfrecord"
    categorical: dict[str, tuple[str, ...]] = field(default_factory=dict)
    feature_names: tuple[str, ...] = ()
    key_dtypes: dict[str, str] = field(default_factory=dict)  # scalar features usable as data.split_key

    @property
    def example_shape(self) -> tuple[int, ...]:
        return self.shape

    def read(self, file):
        """A dataset of one file's serialized records (scalar string); `file` a str or a string tensor."""
        import tensorflow as tf

        return tf.data.TFRecordDataset(file, compression_type=self.compression, buffer_size=1 << 20)

    def parse(self, batch):
        """(inputs [B, *shape] in `dtype`, label texts string [B], or float32 [B] for a float label) from
        serialized records [B].
        """
        import tensorflow as tf

        spec = {self.feature: tf.io.FixedLenFeature(list(self.shape), tf.as_dtype(self.dtype)),
                self.label: tf.io.FixedLenFeature([], tf.as_dtype(self.label_dtype))}
        parsed = tf.io.parse_example(batch, spec)
        label = parsed[self.label]
        return parsed[self.feature], label if label.dtype != tf.int64 else tf.strings.as_string(label)

    def split_keys(self, batch, key: str):
        """The split key of serialized records [B] as strings [B] (`data.split_key`, a declared scalar feature)."""
        import tensorflow as tf

        dtype = self.key_dtypes.get(key)
        if dtype is None:
            raise DatasetError(f"data.split_key: {key!r} needs a scalar entry in data.feature_spec (int64 or string)")
        value = tf.io.parse_example(batch, {key: tf.io.FixedLenFeature([], tf.as_dtype(dtype))})[key]
        return value if value.dtype == tf.string else tf.strings.as_string(value)

    def where(self, index: int, offset: int | None) -> str:
        """A record's place in its file: 1-based record number and the byte offset of its frame."""
        return f"record {index + 1}" + (f" (byte offset {offset})" if offset is not None else "")


def tfrecord_format(config, files: Sequence[str], task: str = "classification") -> TFRecordFormat:
    """The `TFRecordFormat` a `DataSection` declares (feature_spec, features, label, compression of `files`).

    Raises:
        DatasetError: several input features, a feature named in `data.features` without a spec, or files of
            several compressions under `data.compression = "auto"`.
    """
    from tfship.pipeline.data.files import compression_of

    kinds: set[Compression] = {compression_of(f, config.compression) for f in files}
    if len(kinds) > 1:
        raise DatasetError(f"data.compression: the files mix compressions {sorted(k or 'none' for k in kinds)} "
                           "(by suffix); give one kind of file, or set data.compression")
    spec = dict(config.feature_spec)
    names = list(config.features) or [n for n in spec if n != config.label]
    for name in names:
        if name not in spec:
            raise DatasetError(f"data.features: {name!r} has no entry in data.feature_spec {sorted(spec)}")
    if len(names) != 1:
        raise DatasetError(f"the training models take one input; the source has {sorted(names)}: declare a single "
                           "feature in data.features")
    feature = spec[names[0]]
    if feature.dtype == "string":
        raise DatasetError(f"data.feature_spec.{names[0]}: a string feature cannot be a model input; use float32 "
                           "or int64")
    label = spec.get(config.label)
    default_label = "float32" if task == "regression" else "int64"
    return TFRecordFormat(names[0], feature.dtype, tuple(feature.shape), config.label,
                          label.dtype if label is not None else default_label, kinds.pop() if kinds else "",
                          config.input_name or names[0],
                          key_dtypes={n: s.dtype for n, s in spec.items() if not s.shape and s.dtype != "float32"})


@dataclass(frozen=True)
class CsvFormat:
    """CSV lines after a header row: numeric columns float32, categorical columns one-hot, a label column.

    Attributes:
        header: every column of the header, in file order.
        columns: the feature columns, in matrix order.
        categorical: categorical column -> its values (one-hot order).
        label: the label column.
    """

    header: tuple[str, ...]
    columns: tuple[str, ...]
    categorical: dict[str, tuple[str, ...]]
    label: str
    input_name: str
    kind: str = "csv"
    compression: str = "none"

    @property
    def feature_names(self) -> tuple[str, ...]:
        names: list[str] = []
        for column in self.columns:
            names.extend(f"{column}={v}" for v in self.categorical[column]) if column in self.categorical \
                else names.append(column)
        return tuple(names)

    @property
    def example_shape(self) -> tuple[int, ...]:
        return (len(self.feature_names),)

    dtype = "float32"

    def read(self, file):
        """A dataset of one file's data lines (scalar string; the header skipped)."""
        import tensorflow as tf

        return tf.data.TextLineDataset(file, buffer_size=1 << 20).skip(1)

    def _selected(self) -> list[str]:
        wanted = {*self.columns, self.label, *self.categorical}
        return [name for name in self.header if name in wanted]

    def _fields(self, batch) -> dict:
        """The used columns of CSV lines [B] (`decode_csv` with `select_cols`): numeric features float32, the
        label and categorical columns string.
        """
        import tensorflow as tf

        names = self._selected()
        text = {self.label, *self.categorical}
        defaults = [tf.constant([], tf.string) if name in text else tf.constant([], tf.float32) for name in names]
        values = tf.io.decode_csv(batch, defaults, select_cols=[self.header.index(n) for n in names])
        return dict(zip(names, values, strict=True))

    def parse(self, batch):
        """(features float32 [B, F], label texts string [B]) from CSV lines [B]."""
        import tensorflow as tf

        fields = self._fields(batch)
        parts, checks = [], []
        for column in self.columns:
            if column in self.categorical:
                ids = lookup_ids(fields[column], self.categorical[column])
                checks.append(tf.debugging.assert_non_negative(
                    ids, message=f"column {column!r}: a category outside {list(self.categorical[column])}"))
                parts.append(tf.one_hot(ids, len(self.categorical[column]), dtype=tf.float32))
            else:
                parts.append(fields[column][:, None])
        with tf.control_dependencies(checks):
            return tf.concat(parts, axis=1), tf.identity(fields[self.label])

    def for_scan(self) -> CsvFormat:
        """This format less the categorical columns whose values are still to be found (by the scan)."""
        from dataclasses import replace

        open_columns = {c for c, v in self.categorical.items() if not v}
        return replace(self, columns=tuple(c for c in self.columns if c not in open_columns))

    def split_keys(self, batch, key: str):
        """Column `key` of CSV lines [B] as strings [B] (`data.split_key`)."""
        import tensorflow as tf

        if key not in self.header:
            raise DatasetError(f"data.split_key: no column {key!r}; the header has {list(self.header)}")
        (values,) = tf.io.decode_csv(batch, [tf.constant([], tf.string)], select_cols=[self.header.index(key)])
        return values

    def raw_columns(self, batch):
        """The label and categorical columns as strings, for the scan's vocabularies: {column: string [B]}."""
        fields = self._fields(batch)
        return {name: fields[name] for name in [self.label, *self.categorical]}

    def where(self, index: int, offset: int | None) -> str:
        """A record's place: its line (the header is line 1; lines holding quoted newlines shift it)."""
        return f"line {index + 2}"


def lookup_ids(texts, values: Sequence[str]):
    """Index int64 [B] of each of `texts` string [B] in `values`, -1 when absent.

    A broadcast comparison, not a `tf.lookup` table: a table is a stateful resource, and a dataset holding
    one cannot have its iterator checkpointed (tf.data's SerializeIterator refuses it).
    """
    import tensorflow as tf

    equal = tf.equal(tf.expand_dims(texts, -1), tf.constant(list(values), tf.string))
    found = tf.reduce_any(equal, axis=-1)
    index = tf.argmax(tf.cast(equal, tf.int32), axis=-1, output_type=tf.int64)
    return tf.where(found, index, tf.constant(-1, tf.int64))


def csv_columns(config, first_file: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the header of `first_file`, the feature columns: `data.features`, else every column but the label).

    Raises:
        DatasetError: an unreadable header, or a feature, categorical or label column the header lacks.
    """
    import csv

    try:
        with open(first_file, newline="", encoding="utf-8") as handle:
            header = tuple(next(csv.reader(handle), []))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise DatasetError(f"{first_file}: cannot read CSV header: {err}") from err
    columns = tuple(config.features) or tuple(c for c in header if c != config.label)
    for column in [*columns, config.label, *config.categorical]:
        if column not in header:
            raise DatasetError(f"{first_file}: missing column {column!r}; the header has {list(header)}")
    return header, columns


def csv_format(config, first_file: str, vocabularies: Mapping[str, Sequence[str]] | None = None) -> CsvFormat:
    """The `CsvFormat` of a `DataSection`, its header read from the first line of `first_file`.

    Raises:
        DatasetError: an unreadable header, or a feature, categorical or label column the header lacks.
    """
    header, columns = csv_columns(config, first_file)
    vocab = {c: tuple(v) for c, v in config.categorical.items()}
    for column, values in (vocabularies or {}).items():
        if not vocab.get(column):
            vocab[column] = tuple(values)
    return CsvFormat(header, columns, vocab, config.label, config.input_name or "features")

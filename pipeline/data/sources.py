"""Dataset readers: digits, CSV, NPZ, image folders and TFRecord files of tf.Example.

Every reader returns a `SourceData`: features by model input name, int64 labels and the class
names (index = class id). A bad file, a missing column or array, or a label outside the declared
classes raises `DatasetError` naming the file and the line, record or column.

`read_source(config.data)` dispatches on the config; the readers are public so other stages
(validation and calibration data of user models) can call them directly.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tfship.core.errors import DatasetError

DIGITS_IMAGE_SHAPE = (8, 8, 1)
DIGITS_PIXEL_MAX = 16.0
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


@dataclass(frozen=True)
class SourceData:
    """A whole dataset before splitting.

    Attributes:
        features: input name -> array with N rows (float32 features, int32 token ids, ...).
        labels: int64 [N], class ids in [0, len(class_names)).
        class_names: class name per id.
        feature_names: for a stacked CSV matrix, the name of each of its columns (one-hot: `col=value`).
    """

    features: dict[str, np.ndarray]
    labels: np.ndarray
    class_names: tuple[str, ...]
    feature_names: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def single_input(self) -> tuple[str, np.ndarray]:
        """(name, array) of the only input.

        Raises:
            DatasetError: when the source has several inputs (the built-in models take one).
        """
        if len(self.features) != 1:
            raise DatasetError(f"the training models take one input; the source has {sorted(self.features)}: "
                               "declare a single feature array, or use CSV columns (stacked into one matrix)")
        return next(iter(self.features.items()))


def encode_labels(raw: Sequence, classes: Sequence[str], where: str, row_names: Sequence[str] | None = None
                  ) -> tuple[np.ndarray, tuple[str, ...]]:
    """Map raw labels (ints or strings) to int64 class ids.

    Args:
        raw: one label per sample.
        classes: declared class names; empty infers them (numeric labels sorted numerically).
        where: file name used in errors.
        row_names: per-sample location ("line 7") used in errors; default "sample i".

    Raises:
        DatasetError: a label is not one of the declared classes (names the file and the row).
    """
    texts = [x.decode() if isinstance(x, bytes) else str(x.item() if hasattr(x, "item") else x) for x in raw]
    if classes:
        names = tuple(str(c) for c in classes)
    else:
        unique = sorted(set(texts))
        try:
            unique = sorted(unique, key=float)
        except ValueError:
            pass
        names = tuple(unique)
    index = {name: i for i, name in enumerate(names)}
    labels = np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        if text not in index:
            row = row_names[i] if row_names is not None else f"sample {i}"
            raise DatasetError(f"{where}: {row}: label {text!r} is not one of the declared classes {list(names)}")
        labels[i] = index[text]
    return labels, names


def read_digits(input_name: str = "image") -> SourceData:
    """scikit-learn's bundled digits: image float32 [1797, 8, 8, 1] in [0, 1], labels 0..9."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images.astype(np.float32) / DIGITS_PIXEL_MAX).reshape((-1, *DIGITS_IMAGE_SHAPE))
    return SourceData({input_name: images}, bunch.target.astype(np.int64), tuple(str(i) for i in range(10)))


def read_csv(path: Path | str, features: Sequence[str], label: str, *, categorical: Mapping[str, Sequence[str]] = {},
             classes: Sequence[str] = (), input_name: str = "features") -> SourceData:
    """Read a CSV with a header row into one float32 matrix [N, F] under `input_name`.

    Numeric columns are parsed as float32; categorical columns are one-hot encoded over their
    declared values (an empty list infers them, sorted). `features` empty: every column except the
    label.

    Raises:
        DatasetError: unreadable file, missing column, non-numeric value, unknown category or label
            (naming the file, line and column).
    """
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = list(reader.fieldnames or [])
            rows = [(reader.line_num, row) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise DatasetError(f"{path}: cannot read CSV: {err}") from err
    columns = list(features) or [c for c in header if c != label]
    for column in [*columns, label, *categorical]:
        if column not in header:
            raise DatasetError(f"{path}: missing column {column!r}; the header has {header}")
    vocab = {c: list(v) or sorted({row[c] for _, row in rows}) for c, v in categorical.items()}
    names: list[str] = []
    for column in columns:
        if column in vocab:
            names.extend(f"{column}={v}" for v in vocab[column])
        else:
            names.append(column)
    matrix = np.zeros((len(rows), len(names)), dtype=np.float32)
    for r, (line, row) in enumerate(rows):
        offset = 0
        for column in columns:
            value = row[column]
            if column in vocab:
                if value not in vocab[column]:
                    raise DatasetError(f"{path}: line {line}, column {column!r}: category {value!r} is not one of "
                                       f"{vocab[column]}")
                matrix[r, offset + vocab[column].index(value)] = 1.0
                offset += len(vocab[column])
                continue
            try:
                matrix[r, offset] = float(value)
            except (TypeError, ValueError) as err:
                raise DatasetError(f"{path}: line {line}, column {column!r}: {value!r} is not a number") from err
            offset += 1
    labels, class_names = encode_labels([row[label] for _, row in rows], classes, str(path),
                                        [f"line {line}, column {label!r}" for line, _ in rows])
    return SourceData({input_name: matrix}, labels, class_names, tuple(names))


def read_npz(path: Path | str, features: Sequence[str], label: str, *, classes: Sequence[str] = ()) -> SourceData:
    """Read named arrays from an `.npz`: each feature array [N, ...] keeps its name and dtype.

    Raises:
        DatasetError: unreadable file, missing array, or arrays whose first dimensions differ.
    """
    path = Path(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise DatasetError(f"{path}: cannot read NPZ: {err}") from err
    with archive:
        names = list(features) or [k for k in archive.files if k != label]
        for name in [*names, label]:
            if name not in archive.files:
                raise DatasetError(f"{path}: missing array {name!r}; the file has {archive.files}")
        arrays = {name: np.asarray(archive[name]) for name in names}
        raw = archive[label]
    for name, array in arrays.items():
        if array.shape[0] != raw.shape[0]:
            raise DatasetError(f"{path}: array {name!r} has {array.shape[0]} rows, label {label!r} has {raw.shape[0]}")
        if array.dtype == np.float64:
            arrays[name] = array.astype(np.float32)
    labels, class_names = encode_labels(list(raw), classes, str(path))
    return SourceData(arrays, labels, class_names)


def read_image_folder(path: Path | str, image_size: tuple[int, int], *, rescale: float = 1.0 / 255.0,
                      color_mode: str = "rgb", classes: Sequence[str] = (), input_name: str = "image") -> SourceData:
    """Read `<path>/<class>/<image>` files: float32 [N, height, width, channels], pixels times `rescale`.

    Class names are the subfolder names (sorted), or the declared `classes` (a subfolder outside
    them is an error). Images are resized with bilinear interpolation.

    Raises:
        DatasetError: missing folder, no images, an undecodable file (named) or an undeclared class folder.
    """
    import tensorflow as tf

    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"{root}: image folder not found")
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    names = tuple(classes) or tuple(p.name for p in folders)
    for folder in folders:
        if folder.name not in names:
            raise DatasetError(f"{folder}: class folder {folder.name!r} is not one of the declared classes "
                               f"{list(names)}")
    channels = 1 if color_mode == "grayscale" else 3
    images, labels = [], []
    for class_id, name in enumerate(names):
        for file in sorted((root / name).glob("*")) if (root / name).is_dir() else []:
            if file.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            try:
                decoded = tf.io.decode_image(tf.io.read_file(str(file)), channels=channels, expand_animations=False)
            except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as err:
                raise DatasetError(f"{file}: cannot decode image: {err.message.splitlines()[0]}") from err
            resized = tf.image.resize(tf.cast(decoded, tf.float32), image_size)
            images.append(resized.numpy() * np.float32(rescale))
            labels.append(class_id)
    if not images:
        raise DatasetError(f"{root}: no images ({', '.join(IMAGE_SUFFIXES)}) in class subfolders {list(names)}")
    return SourceData({input_name: np.stack(images).astype(np.float32)}, np.asarray(labels, np.int64), names)


def _feature_spec(spec: Mapping, label: str):
    import tensorflow as tf

    dtypes = {"float32": tf.float32, "int64": tf.int64, "string": tf.string}
    parsed = {name: tf.io.FixedLenFeature(list(s.shape), dtypes[s.dtype]) for name, s in spec.items()}
    parsed.setdefault(label, tf.io.FixedLenFeature([], tf.int64))
    return parsed


def read_tfrecord(paths: Sequence[Path | str] | Path | str, feature_spec: Mapping, label: str, *,
                  features: Sequence[str] = (), classes: Sequence[str] = ()) -> SourceData:
    """Read TFRecord files of tf.Example with a declared feature spec.

    Args:
        paths: one file, a glob pattern, or several files.
        feature_spec: name -> object with `.dtype` ("float32" | "int64" | "string") and `.shape`; the
            label defaults to an int64 scalar.
        label: label feature (int64 class id or string class name).
        features: input features (default: every spec entry except the label).

    Raises:
        DatasetError: no file, a corrupt record or an example missing a feature (naming file and record).
    """
    import tensorflow as tf

    files = [str(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    files = sorted({f for pattern in files for f in tf.io.gfile.glob(pattern)})
    if not files:
        raise DatasetError(f"{paths}: no TFRecord file found")
    spec = _feature_spec(feature_spec, label)
    names = list(features) or [n for n in spec if n != label]
    for name in names:
        if name not in spec:
            raise DatasetError(f"data.features: {name!r} has no entry in data.feature_spec {sorted(spec)}")
    columns: dict[str, list] = {n: [] for n in [*names, label]}
    for file in files:
        record = -1
        try:
            for record, serialized in enumerate(tf.data.TFRecordDataset(file)):  # noqa: B007 - named on error
                example = tf.io.parse_single_example(serialized, spec)
                for name in columns:
                    columns[name].append(example[name].numpy())
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as err:
            raise DatasetError(f"{file}: record {record + 1}: {err.message.splitlines()[0]}") from err
    arrays = {n: np.stack(columns[n]) for n in names}
    labels, class_names = encode_labels(columns[label], classes, ",".join(files))
    return SourceData(arrays, labels, class_names)


def read_source(config) -> SourceData:
    """Read the dataset a `DataSection` declares (see the readers above for shapes and errors).

    Raises:
        DatasetError: missing `data.path` or `data.image_size`, or any reader error.
    """
    if config.source == "digits":
        return read_digits(config.input_name or "image")
    if config.path is None:
        raise DatasetError(f"data.path: required for data.source = {config.source!r}")
    if config.source == "csv":
        return read_csv(config.path, config.features, config.label, categorical=config.categorical,
                        classes=config.classes, input_name=config.input_name or "features")
    if config.source == "npz":
        data = read_npz(config.path, config.features, config.label, classes=config.classes)
    elif config.source == "image_folder":
        if config.image_size is None:
            raise DatasetError("data.image_size: required for data.source = 'image_folder' ([height, width])")
        return read_image_folder(config.path, config.image_size, rescale=config.rescale, color_mode=config.color_mode,
                                 classes=config.classes, input_name=config.input_name or "image")
    else:
        data = read_tfrecord(str(config.path), config.feature_spec, config.label, features=config.features,
                             classes=config.classes)
    if config.input_name and len(data.features) == 1:
        return SourceData({config.input_name: next(iter(data.features.values()))}, data.labels, data.class_names)
    return data

"""The streaming sources (`tfrecord`, `csv`, `image_folder`) as `DatasetSplits` of `StreamSplit`s.

Nothing is materialised but bounded samples: the splits are tf.data pipelines over the files
(`pipeline.data.stream`). One counted pass (`pipeline.data.scan`, cached) finds the record counts per
split, the class names when none are declared (classification), the vocabularies of string inputs and CSV
categories, and stops on bad data (labels checked by task). With `data.split_sizes` declared, there is no pass:
the sizes are taken as given (so class names and string vocabularies must be declared too).

A tabular or recommender model reads named inputs (`pipeline.data.named_format.NamedFormat`: one input per
TFRecord feature or CSV column); over a one-input source (image folder) it gets a dict with that one input.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from tfship.core.errors import DatasetError

STREAMING_SOURCES = ("tfrecord", "csv", "image_folder")


def file_sets(config) -> dict[str, tuple[str, ...]]:
    """{"all": files} for a hash split of `data.path`, else {"train": ..., "validation": ..., "test": ...}.

    Raises:
        DatasetError: no path, only some of the three split paths, a glob matching nothing, an unreadable file.
    """
    from tfship.pipeline.data.files import expand

    separate = {"train": config.train_path, "validation": config.validation_path, "test": config.test_path}
    given = [name for name, path in separate.items() if path is not None]
    if given and len(given) != 3:
        missing = [f"data.{name}_path" for name in separate if name not in given]
        raise DatasetError(f"data: {', '.join(missing)} missing: give the train, validation and test file sets "
                           "together, or `data.path` alone (hash split)")
    if given:
        return {name: expand(str(path), f"data.{name}_path") for name, path in separate.items()}
    if config.path is None:
        raise DatasetError(f"data.path: required for data.source = {config.source!r}")
    return {"all": expand(str(config.path), "data.path")}


NAMED_KINDS = ("tabular", "recommender")


def record_format(config, files: tuple[str, ...], class_names: tuple[str, ...] = (), kind: str = "cnn",
                  task: str = "classification"):
    """The record format of the configured source: for a tabular or recommender model over TFRecord or CSV,
    a `NamedFormat` (one input per feature or column); else TFRecord, CSV (one matrix) or image folder.
    """
    from tfship.pipeline.data import formats

    if kind in NAMED_KINDS and config.source in ("tfrecord", "csv"):
        from tfship.pipeline.data.named_format import named_csv_format, named_tfrecord_format

        return named_tfrecord_format(config, files, task) if config.source == "tfrecord" else \
            named_csv_format(config, files[0])
    if config.source == "tfrecord":
        return formats.tfrecord_format(config, files, task)
    if config.source == "csv":
        return formats.csv_format(config, files[0])
    from tfship.pipeline.data.images import image_format

    return image_format(config, class_names, files[0])


def load_stream_splits(config, seed: int, cache_dir: Path | None = None,
                       say: Callable[[str], None] | None = None, *, kind: str = "cnn", task: str = "classification"):
    """Train, validation and test `StreamSplit`s of a streaming source, with bounded samples.

    In a process that will join a cluster (TF_CONFIG set) whose TensorFlow runtime has not started yet, the
    work runs in a spawned child process: MultiWorkerMirroredStrategy must configure collectives before
    TensorFlow's runtime starts, and the scan and samples would start it. The splits come back as plain
    values (formats, file names, counts, NumPy samples).

    Args:
        config: the `DataSection`.
        seed: unused by the hash split (it is stable by design); kept for the caller's signature.
        cache_dir: where the scan's result is cached (None: not cached).
        say: progress line sink (stderr in a child process).
        kind: `model.kind`: tabular and recommender read named inputs (a dict per batch).
        task: `model.task`: how labels are checked and converted (`pipeline.data.labels`).

    Raises:
        DatasetError: any file, record or label error (named), or a split with no records.
    """
    if os.environ.get("TF_CONFIG") and not _tensorflow_started():
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(1) as pool:
            return pool.apply(_load_stream_splits, (config, seed, cache_dir, None, kind, task))
    return _load_stream_splits(config, seed, cache_dir, say, kind, task)


def _tensorflow_started() -> bool:
    import sys as _sys

    if "tensorflow" not in _sys.modules:
        return False
    from tensorflow.python.eager import context

    return bool(context.context()._initialized)


def _load_stream_splits(config, seed: int, cache_dir: Path | None = None, say: Callable[[str], None] | None = None,
                        kind: str = "cnn", task: str = "classification"):
    from tfship.pipeline.data.formats import CsvFormat
    from tfship.pipeline.data.input_spec import InputSpec
    from tfship.pipeline.data.labels import label_rule
    from tfship.pipeline.data.named_format import NamedFormat
    from tfship.pipeline.data.scan import cached_scan, scan, scan_key
    from tfship.pipeline.data.split_types import DatasetSplits
    from tfship.pipeline.data.stream import HashSplit, StreamSplit

    folder_classes: tuple[str, ...] = ()
    if config.source == "image_folder":
        import tempfile

        from tfship.pipeline.data.images import image_file_sets

        listing_dir = cache_dir or Path(tempfile.gettempdir()) / "tfship-image-listings"
        sets, folder_classes = image_file_sets(config, listing_dir)
    else:
        sets = file_sets(config)
    every = tuple(f for files in sets.values() for f in files)
    fmt = record_format(config, every, folder_classes, kind, task)
    if config.split_key is not None and not hasattr(fmt, "split_keys"):
        raise DatasetError(f"data.split_key: not available for data.source = {config.source!r} (TFRecord, CSV)")
    hash_split = HashSplit.from_fractions(config.validation_fraction, config.test_fraction, config.split_key,
                                          fmt) if "all" in sets else None
    order = [(files, None if name == "all" else ("train", "validation", "test").index(name))
             for name, files in sets.items()]
    scan_fmt = fmt.for_scan() if isinstance(fmt, CsvFormat) else fmt
    declared = tuple(folder_classes or config.classes)
    rule = label_rule(task, declared, getattr(fmt, "label_dtype", "string") == "int64")
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    if config.split_sizes:
        result = _declared_sizes(config)
    else:
        result = cached_scan(cache_dir, scan_key(config, sets, f"{kind}\0{task}"), lambda: scan(
            scan_fmt, order, hash_split, skip_corrupt=config.skip_corrupt, declared_classes=declared, say=say,
            labels_by=rule))
    class_names = {"binary": ("0", "1"), "regression": ()}.get(task, declared or result.labels)
    if config.source == "csv" and isinstance(fmt, CsvFormat):
        from tfship.pipeline.data.formats import csv_format

        fmt = csv_format(config, every[0], result.categories)
    if isinstance(fmt, NamedFormat):
        fmt = fmt.with_vocabularies(result.categories)
    if task == "classification":
        if len(class_names) < 2:
            raise DatasetError(f"data: {result.records} records hold {len(class_names)} class(es) "
                               f"{list(class_names)}; a classifier needs at least 2")
        rule = label_rule(task, class_names, rule.ids)
    one_named = kind in NAMED_KINDS and not getattr(fmt, "named", False)
    bad = {int(k): v for k, v in result.bad_records.items()}
    splits = {}
    for index, name in enumerate(("train", "validation", "test")):
        files = sets[name] if name in sets else sets["all"]
        offset = 0 if "all" in sets else sum(len(sets[n]) for n in ("train", "validation", "test")[:index])
        split_bad = {i - offset: rows for i, rows in bad.items() if offset <= i < offset + len(files)}
        if result.counts[name] == 0:
            raise DatasetError(f"data: the {name} split has no records ({result.records} records read); "
                               f"check the files or data.{'validation' if name != 'test' else 'test'}_fraction")
        splits[name] = StreamSplit(name, fmt, files, index if "all" in sets else None, hash_split, class_names,
                                   result.counts[name], bad_records=split_bad, skip_corrupt=config.skip_corrupt,
                                   cache=config.stream_cache if name == "train" else "none", labels_by=rule,
                                   as_dict=fmt.input_name if one_named else None)
    sample = config.sample_size
    splits = {name: split.with_sample(sample) for name, split in splits.items()}
    specs = tuple(getattr(fmt, "specs", ()))
    if one_named:
        images = splits["train"].images
        specs = (InputSpec(fmt.input_name, fmt.input_name, "dense", "float32",
                           tuple(images[fmt.input_name].shape[1:]), str(images[fmt.input_name].dtype)),)
    return DatasetSplits(
        train=splits["train"], validation=splits["validation"], test=splits["test"],
        class_names=tuple(class_names), input_name=fmt.input_name, feature_names=tuple(fmt.feature_names),
        stream=_stream_summary(config, sets, fmt, result), task=task, specs=specs, sample_size=sample)


def _declared_sizes(config):
    """The `ScanResult` of declared split sizes (`data.split_sizes`): no pass over the data."""
    from tfship.pipeline.data.scan import ScanResult

    counts = {name: int(config.split_sizes.get(name, 0)) for name in ("train", "validation", "test")}
    return ScanResult(counts=counts, labels=(), categories={}, bad_records={},
                      skipped={"malformed_records": 0, "corrupt_frames": 0, "details": []},
                      records=sum(counts.values()), seconds=0.0, files=0)


def _stream_summary(config, sets, fmt, result) -> dict:
    return {"source": config.source, "format": fmt.kind, "files": {k: len(v) for k, v in sets.items()},
            "split": ("separate file sets" if "all" not in sets else "hash of the record bytes"
                      if config.split_key is None else f"hash of {config.split_key!r}"),
            "scan": replace(result, bad_records={}).to_json(), "sample_size": config.sample_size,
            "counts": "declared (data.split_sizes), not counted" if config.split_sizes else "counted by the scan"}

"""Streaming splits: one split of a file-based source as a tf.data pipeline, end to end.

The pipeline (training): files -> [shard by file across workers] -> parallel, deterministic interleave of
the files' records -> [hash-split filter] -> [skip known-bad records] -> [cache: memory or file] -> seeded
shuffle -> repeat -> batch(drop_remainder) -> vectorised parse of the whole batch (AUTOTUNE map) ->
class ids -> prefetch(AUTOTUNE). Evaluation: the same without shuffle and repeat, keeping the last partial
batch. This follows the tf.data performance guide (interleave, vectorised map, cache, prefetch).

The hash split needs no pass over the data: a record belongs to train, validation or test by
`tf.strings.to_hash_bucket_fast(record bytes, 10000)` (FarmHash fingerprint, stable across runs and
machines) against the split fractions. With `data.train_path` / `validation_path` / `test_path` each
split is its own file set instead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HASH_BUCKETS = 10_000
SPLIT_NAMES = ("train", "validation", "test")
_SPLIT_BATCH = 1024  # records hashed per vectorised call of the split filter
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HashSplit:
    """Which hash buckets go where: bucket < train_below: train; < validation_below: validation; else test.

    `key` (`data.split_key`): hash that feature or column of each record (read by `format.split_keys`)
    instead of the record's bytes.
    """

    train_below: int
    validation_below: int
    key: str | None = None
    format: Any = None

    @classmethod
    def from_fractions(cls, validation: float, test: float, key: str | None = None, fmt: Any = None) -> HashSplit:
        train = round((1.0 - validation - test) * HASH_BUCKETS)
        return cls(train, train + round(validation * HASH_BUCKETS), key, fmt)

    def split_ids(self, records):
        """Split id (0 train, 1 validation, 2 test) int32 [B] of raw records string [B]."""
        import tensorflow as tf

        hashed = records if self.key is None else self.format.split_keys(records, self.key)
        bucket = tf.strings.to_hash_bucket_fast(hashed, HASH_BUCKETS)
        return tf.cast(bucket >= self.train_below, tf.int32) + tf.cast(bucket >= self.validation_below, tf.int32)


@dataclass(frozen=True)
class StreamSplit:
    """One split of a streaming source.

    Attributes:
        name: "train" | "validation" | "test".
        files: the files it reads (sorted).
        split_id: which hash split of the files' records it keeps (None: every record of `files`).
        records: how many records it holds (counted by the scan, skipped records excluded).
        sample: a bounded array sample, the first `data.sample_size` records in file order: `images`
            [n, *example_shape] (named inputs: {input name: [n, ...]}), `labels` [n] (int64; regression
            float32) (the gate, warm-up, query, normalisation use it).
        bad_records: file index -> record indices the scan found malformed (skipped under skip_corrupt).
        labels_by: the `pipeline.data.labels.LabelRule` of the run's task (None: classification over
            `class_names`).
        as_dict: a one-input format read for a named-input model: inputs come as {as_dict: inputs}.
    """

    name: str
    format: Any
    files: tuple[str, ...]
    split_id: int | None
    hash_split: HashSplit | None
    class_names: tuple[str, ...]
    records: int
    sample: Any = None
    bad_records: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    skip_corrupt: bool = False
    cache: str = "none"
    labels_by: Any = None
    as_dict: str | None = None  # a one-input source for a named-input model: {as_dict: inputs}

    def __len__(self) -> int:
        return self.records

    @property
    def task(self) -> str:
        return self.labels_by.task if self.labels_by is not None else "classification"

    @property
    def images(self) -> np.ndarray | dict[str, np.ndarray]:
        """The bounded sample's inputs [n, *example_shape], or {input name: [n, ...]} (not the whole split)."""
        return self.sample.images

    @property
    def labels(self) -> np.ndarray:
        """The bounded sample's labels [n]: int64 class ids (binary 0/1), float32 for regression."""
        return self.sample.labels

    def dataset(self, batch_size: int, *, training: bool, seed: int, shuffle_buffer: int = 2048,
                repeat: bool = False, shard: tuple[int, int] | None = None, raw: bool = False):
        """The split as `tf.data.Dataset` of (inputs, labels): inputs [B, *example_shape] (named inputs: a dict
        {input name: [B, ...]}: float32, int64 ids or raw strings), labels [B] int64 class ids (classification),
        int64 0/1 (binary) or float32 (regression). No `tf.lookup` table: the iterator is checkpointable.

        Args:
            batch_size: records per batch.
            training: shuffle (seeded, reshuffled each epoch), drop the partial batch (`drop_remainder`).
            repeat: endless (one iterator, checkpointed with the model, for the whole training).
            shard: (workers, rank): this worker's part; by file when there are at least as many files as
                workers, else by record (every worker reads the files, keeps every workers-th record; warned).
            raw: return the serialized records (batched), unparsed (the benchmark's reference point).
        """
        import tensorflow as tf

        files = tf.data.Dataset.from_tensor_slices((tf.range(len(self.files), dtype=tf.int64), list(self.files)))
        by_record = None
        if shard is not None and shard[0] > 1:
            if len(self.files) >= shard[0]:
                files = files.shard(*shard)
            else:
                log.warning("%s split: %d file(s) for %d workers: sharded by record (each worker reads every file "
                            "and keeps every %d-th record)", self.name, len(self.files), shard[0], shard[0])
                by_record = shard
        if training and self.cache == "none":
            files = files.shuffle(len(self.files), seed=seed, reshuffle_each_iteration=True)
        records = files.interleave(self._file_records, cycle_length=min(len(self.files), 8),  # pyright: ignore[reportArgumentType]  # tf stub: a tuple dataset's map function gets each part as an argument
                                   num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if by_record is not None:
            records = records.shard(*by_record)
        if self.split_id is not None:
            records = records.batch(_SPLIT_BATCH).map(self._keep_split, num_parallel_calls=tf.data.AUTOTUNE,
                                                      deterministic=True).unbatch()
        if self.cache == "memory":
            records = records.cache()
        elif self.cache != "none":
            records = records.cache(f"{self.cache}-{self.name}")
        if training:
            records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        if repeat:
            records = records.repeat()
        if getattr(self.format, "per_record", False) and not raw:  # images: decode one by one, then batch
            records = records.map(self.format.decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            if self.skip_corrupt:
                records = records.ignore_errors()
        batches = records.batch(batch_size, drop_remainder=training, num_parallel_calls=tf.data.AUTOTUNE,
                                deterministic=True)
        if not raw:
            batches = batches.map(self._parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return batches.prefetch(tf.data.AUTOTUNE)

    def _file_records(self, index, file):
        import tensorflow as tf

        records = self.format.read(file)
        if self.skip_corrupt:
            records = records.ignore_errors()  # a corrupt frame ends its file's records (counted by the scan)
        bad = [(i, r) for i, rows in self.bad_records.items() for r in rows]
        if bad:  # a constant and a comparison (no lookup table: it would make the iterator uncheckpointable)
            keys = tf.constant([(i << 32) + r for i, r in bad], tf.int64)
            records = records.enumerate().filter(
                lambda r, _: tf.logical_not(tf.reduce_any(tf.equal(index * (1 << 32) + r, keys))))
            records = records.map(lambda _, record: record)
        return records

    def _keep_split(self, records):
        import tensorflow as tf

        assert self.hash_split is not None and self.split_id is not None  # mapped over a hash split only (dataset)
        return tf.boolean_mask(records, tf.equal(self.hash_split.split_ids(records), self.split_id))

    def _parse(self, *batch):
        from tfship.pipeline.data.labels import LabelRule

        batch = batch[0] if len(batch) == 1 else batch
        if getattr(self.format, "per_record", False):
            inputs, texts = batch  # decoded per record already
        else:
            inputs, texts = self.format.parse(batch)
        if self.as_dict is not None:
            inputs = {self.as_dict: inputs}
        return inputs, (self.labels_by or LabelRule("classification", self.class_names)).to_tensor(texts)

    def take_sample(self, count: int) -> Any:
        """The first `count` records in file order as an `ArraySplit` (`pipeline.data.splits`)."""
        import tensorflow as tf

        from tfship.pipeline.data.split_types import ArraySplit

        inputs, labels = [], []
        taken = 0
        try:
            for batch_inputs, batch_labels in self.dataset(min(count, 512), training=False, seed=0):
                inputs.append({k: v.numpy() for k, v in batch_inputs.items()} if isinstance(batch_inputs, dict)
                              else batch_inputs.numpy())
                labels.append(batch_labels.numpy())
                taken += len(labels[-1])
                if taken >= count:
                    break
        except tf.errors.OpError as err:
            raise self.read_error(err) from None
        label_dtype = np.float32 if self.task == "regression" else np.int64
        if not inputs:
            if hasattr(self.format, "empty_inputs"):
                return ArraySplit(self.format.empty_inputs(), np.zeros(0, label_dtype))
            shape = (0, *self.format.example_shape)
            return ArraySplit(np.zeros(shape, np.dtype(self.format.dtype)), np.zeros(0, label_dtype))
        if isinstance(inputs[0], dict):
            joined = {k: np.concatenate([part[k] for part in inputs])[:count] for k in inputs[0]}
            return ArraySplit(joined, np.concatenate(labels)[:count])
        return ArraySplit(np.concatenate(inputs)[:count], np.concatenate(labels)[:count])

    def read_error(self, err) -> Exception:
        """A `DatasetError` for a read, decode or parse failure while streaming: an image is named (found by
        decoding one by one); a record error after the scan passed means the files changed since.
        """
        from tfship.core.errors import DatasetError

        if getattr(self.format, "kind", "") == "image_folder":
            from tfship.pipeline.data.images import locate_undecodable

            return DatasetError(f"data: {locate_undecodable(self)} (data.skip_corrupt = true skips such images)")
        text = str(getattr(err, "message", err))
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        return DatasetError(f"data: the {self.name} split failed while streaming ({type(err).__name__}: "
                            f"{first[:200]}); the files changed since they were scanned: run again to re-scan them")

    def with_sample(self, count: int) -> StreamSplit:
        from dataclasses import replace

        return replace(self, sample=self.take_sample(count))

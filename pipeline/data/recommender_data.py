"""A synthetic recommender data set with a planted signal: N tf.Examples in S TFRecord shards, nothing downloaded.

Each record is one (user, candidate item) impression:

* `user_id` int64 [] in [1, users), `item_id` int64 [] in [1, items) (0 is kept for padding);
* `history` int64 [1..history_length] the user's recent item ids (variable length);
* `dense` float32 [4] context features (standard normal);
* `label` int64 [] 0/1, whether the user took the item.

The planted signal: users and items belong to one of `clusters` taste groups (by a seeded hash of the id);
a user's history is drawn mostly from its own group. The label is Bernoulli(sigmoid(logit)) with
logit = 2.0 * [item group == user group] + 1.5 * (share of the history in the item's group) + 0.8 * dense[0]
- 1.8. A model that learns the groups from the ids, the history and the first dense feature can reach the
planted logit's AUC (`planted_auc` in manifest.json, computed on the held-out shards: the best AUC any
model can expect, since the labels are drawn from it); a model that learns nothing scores 0.5.

Shards are `part-<i>-of-<S>.tfrecord`; the last shard is held out (test), the one before validation, when
S >= 3 (`manifest.json` lists them). Generation is vectorised in NumPy per shard; records are serialized
with `tf.train.Example`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tfship.core.errors import ConfigError
from tfship.core.tasks import roc_auc

DENSE_WIDTH = 4


@dataclass(frozen=True)
class RecommenderDataSpec:
    """What to generate: `records` in `shards` files, id ranges, history length, taste groups, seed."""

    records: int = 100_000
    shards: int = 8
    users: int = 50_000
    items: int = 50_000
    history_length: int = 20
    clusters: int = 16
    seed: int = 0

    def check(self) -> None:
        """Raises ConfigError naming the first value out of range."""
        for name, low in (("records", 1), ("shards", 1), ("users", 2), ("items", 2), ("history_length", 1),
                          ("clusters", 2)):
            if getattr(self, name) < low:
                raise ConfigError(f"make-recommender-data: --{name.replace('_', '-')} = {getattr(self, name)}; "
                                  f"expected >= {low}")
        if self.records < self.shards:
            raise ConfigError(f"make-recommender-data: --records = {self.records} < --shards = {self.shards}")


def _group(ids: np.ndarray, clusters: int, salt: int) -> np.ndarray:
    """A seeded, stable taste group in [0, clusters) of each id (a multiplicative hash)."""
    mixed = (ids.astype(np.uint64) * np.uint64(2654435761) + np.uint64(salt)) % np.uint64(2**32)
    return (mixed % np.uint64(clusters)).astype(np.int64)


def generate_shard(spec: RecommenderDataSpec, shard: int, rows: int) -> dict[str, np.ndarray]:
    """One shard's columns: user_id, item_id [rows] int64, history [rows, history_length] int64 (0-padded),
    history_length [rows], dense [rows, 4] float32, label [rows] int64, logit [rows] float64 (planted).
    """
    rng = np.random.default_rng([spec.seed, shard])
    users = rng.integers(1, spec.users, rows)
    items = rng.integers(1, spec.items, rows)
    user_group = _group(users, spec.clusters, spec.seed)
    lengths = rng.integers(1, spec.history_length + 1, rows)
    # History: 80 % of ids from the user's own group (id = group + k * clusters), the rest uniform.
    own = rng.random((rows, spec.history_length)) < 0.8
    offsets = rng.integers(0, max(1, (spec.items - 1) // spec.clusters), (rows, spec.history_length))
    in_group = _ids_in_group(user_group[:, None], offsets, spec)
    history = np.where(own, in_group, rng.integers(1, spec.items, (rows, spec.history_length)))
    history = np.where(np.arange(spec.history_length)[None, :] < lengths[:, None], history, 0)
    item_group = _group(items, spec.clusters, spec.seed)
    history_group = _group(history, spec.clusters, spec.seed)
    share = ((history_group == item_group[:, None]) & (history > 0)).sum(axis=1) / lengths
    dense = rng.standard_normal((rows, DENSE_WIDTH)).astype(np.float32)
    logit = 2.0 * (item_group == user_group) + 1.5 * share + 0.8 * dense[:, 0] - 1.8
    label = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    return {"user_id": users, "item_id": items, "history": history, "history_length": lengths, "dense": dense,
            "label": label, "logit": logit}


def _ids_in_group(groups: np.ndarray, offsets: np.ndarray, spec: RecommenderDataSpec) -> np.ndarray:
    """Ids in [1, items) whose `_group` is `groups`: found by trying candidates (the hash is no inverse)."""
    table = _group_members(spec)
    sizes = np.array([len(table[g]) for g in range(spec.clusters)])
    flat_groups = np.broadcast_to(groups, offsets.shape)
    picks = offsets % np.maximum(sizes[flat_groups], 1)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    members = np.concatenate([table[g] for g in range(spec.clusters)])
    return members[starts[flat_groups] + picks]


_MEMBERS: dict[tuple, list[np.ndarray]] = {}


def _group_members(spec: RecommenderDataSpec) -> list[np.ndarray]:
    key = (spec.items, spec.clusters, spec.seed)
    if key not in _MEMBERS:
        ids = np.arange(1, spec.items)
        groups = _group(ids, spec.clusters, spec.seed)
        _MEMBERS[key] = [ids[groups == g] if np.any(groups == g) else ids[:1] for g in range(spec.clusters)]
    return _MEMBERS[key]


def _serialize(columns: dict[str, np.ndarray], row: int) -> bytes:
    import tensorflow as tf

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    length = int(columns["history_length"][row])
    return tf.train.Example(features=tf.train.Features(feature={
        "user_id": ints([int(columns["user_id"][row])]), "item_id": ints([int(columns["item_id"][row])]),
        "history": ints(columns["history"][row, :length].tolist()),
        "dense": tf.train.Feature(float_list=tf.train.FloatList(value=columns["dense"][row].tolist())),
        "label": ints([int(columns["label"][row])])})).SerializeToString()


def write_recommender_data(out: Path | str, spec: RecommenderDataSpec, say=print) -> dict:
    """Write the shards and `manifest.json` into `out`; return the manifest.

    Each shard is written to a `.partial` name and renamed when complete, so an interrupted run leaves no
    shard that looks whole.

    Raises:
        ConfigError: a value out of range (`RecommenderDataSpec.check`).
    """
    import tensorflow as tf

    spec.check()
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    per_shard = np.full(spec.shards, spec.records // spec.shards)
    per_shard[: spec.records % spec.shards] += 1
    names, held_logits, held_labels = [], [], []
    for shard, rows in enumerate(per_shard):
        columns = generate_shard(spec, shard, int(rows))
        name = f"part-{shard:05d}-of-{spec.shards:05d}.tfrecord"
        partial = folder / f"{name}.partial"
        with tf.io.TFRecordWriter(str(partial)) as writer:
            for row in range(int(rows)):
                writer.write(_serialize(columns, row))
        os.replace(partial, folder / name)
        names.append(name)
        if shard == spec.shards - 1:
            held_logits.append(columns["logit"])
            held_labels.append(columns["label"])
        say(f"make-recommender-data: shard {shard + 1}/{spec.shards} ({int(rows):,} records) {name}")
    logits, labels = np.concatenate(held_logits), np.concatenate(held_labels)
    manifest = {"spec": asdict(spec), "shards": names, "test": names[-1:],
                "validation": names[-2:-1] if spec.shards >= 3 else [],
                "train": names[:-2] if spec.shards >= 3 else names[:-1] or names,
                "positive_share": round(float(labels.mean()), 4),
                "planted_auc": round(roc_auc(logits, labels), 4), "planted_auc_rows": int(len(labels))}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def recommender_feature_spec(spec: RecommenderDataSpec) -> dict:
    """The `data.feature_spec` table (TOML-ready dict) describing the generated records as model inputs."""
    return {"user_id": {"dtype": "int64", "kind": "categorical", "num_ids": spec.users},
            "item_id": {"dtype": "int64", "kind": "categorical", "num_ids": spec.items},
            "history": {"dtype": "int64", "kind": "sequence", "num_ids": spec.items, "length": spec.history_length},
            "dense": {"dtype": "float32", "shape": [DENSE_WIDTH]},
            "label": {"dtype": "int64"}}

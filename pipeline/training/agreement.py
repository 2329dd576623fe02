"""Before the first step, every worker of a multi-worker run must be training the same thing.

`fingerprints(...)` reduces what must match to named 63-bit numbers: the run seed, the `[data]` (without
`path`, which may differ per host), `[model]` and `[train]` tables, the cluster in `TF_CONFIG`, the code
(tfship's version and the source of the packages training runs), the training data itself (arrays, dtypes,
shapes, class names) and the starting step (0, or the step of the checkpoint being resumed). The chief
compares them before TensorFlow connects (`pipeline.training.rendezvous`), and `disagreement(...)` is the one
line naming what differs and which workers hold which value.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np

_PACKAGES = ("core", "pipeline", "signatures")


def _number(data: bytes) -> int:
    """A 63-bit non-negative number from sha256 (fits int64 with room)."""
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") >> 1


def _json_number(value) -> int:
    return _number(json.dumps(value, sort_keys=True, default=str).encode())


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> int:
    """The tfship version and every `.py` file under the packages training runs (core, pipeline, signatures)."""
    import tfship

    root = Path(tfship.__file__).resolve().parent
    digest = hashlib.sha256()
    try:
        from importlib.metadata import version

        digest.update(version("tfship").encode())
    except Exception:  # noqa: BLE001 - a source checkout without metadata: the files alone
        pass
    for package in _PACKAGES:
        base = (root / package).resolve()
        for path in sorted(base.rglob("*.py")):
            digest.update(str(path.relative_to(base)).encode())
            digest.update(path.read_bytes())
    return int.from_bytes(digest.digest()[:8], "big") >> 1


def data_fingerprint(images, labels: np.ndarray, class_names) -> int:
    """The training split's content: dtype, shape and bytes of inputs (one array, or a dict of named arrays in
    name order) and labels, and the class names.
    """
    digest = hashlib.sha256()
    named = sorted(images.items()) if isinstance(images, dict) else [("", images)]
    for name, array in [*named, ("label", labels)]:
        array = np.ascontiguousarray(array)
        digest.update(f"{name}{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
    digest.update(json.dumps(list(class_names)).encode())
    return int.from_bytes(digest.digest()[:8], "big") >> 1


def fingerprints(config, cluster_jobs: dict, splits, start_step: int) -> dict[str, int]:
    """The named values every worker must share (see the module docstring); insertion order is reported order."""
    data = config.data.model_dump(mode="json")
    data.pop("path", None)
    return {"run.seed": int(config.run.seed), "[data] settings": _json_number(data),
            "[model] settings": _json_number(config.model.model_dump(mode="json")),
            "[train] settings": _json_number(config.train.model_dump(mode="json")),
            "TF_CONFIG cluster": _json_number(cluster_jobs),
            "code version": code_fingerprint(),
            "training data": data_fingerprint(splits.train.images, splits.train.labels, splits.class_names),
            "starting step": int(start_step)}


def disagreement(names: list[str], rows: np.ndarray, task_names: list[str]) -> str | None:
    """The one-line description of what differs between `rows` (one per worker), or None when all agree."""
    differing = [i for i in range(len(names)) if len(set(rows[:, i].tolist())) > 1]
    if not differing:
        return None
    parts = []
    for i in differing:
        groups: dict[int, list[str]] = {}
        for row, task in zip(rows[:, i].tolist(), task_names, strict=True):
            groups.setdefault(row, []).append(task)
        plain = names[i] in ("starting step", "run.seed")
        shown = "; ".join(f"{', '.join(tasks)}: {value if plain else format(value, 'x')[:8]}"
                          for value, tasks in groups.items())
        parts.append(f"{names[i]} ({shown})")
    return ("train: the workers differ before the first step in " + ", ".join(parts)
            + "; start every worker with the same config, code, data and checkpoint (all fresh, or all --resume)")

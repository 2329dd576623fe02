"""Files written whole or not at all: JSON through a temporary sibling and `os.replace`; NPZ archives by name."""

from __future__ import annotations

import enum
import json
import os
import secrets
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def write_json_atomic(path: Path, payload: Any) -> Path:
    """Write JSON through a temporary file in the same folder and `os.replace` it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    temporary.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return path


def _json_default(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_npz(path: Path, arrays: Mapping[str, Any]) -> None:
    """`np.savez(path, **arrays)` without its keyword channel: an array named `file` or `allow_pickle` (valid input
    names) is stored under its name, where `np.savez` would refuse it (`file`) or take it for its flag and drop it
    (`allow_pickle`). The same archive: one uncompressed `<name>.npy` member per array (`np.asanyarray`; object
    arrays pickled, as `np.savez`), `.npz` appended to a path not ending in it.
    """
    target = os.fspath(path)
    if not target.endswith(".npz"):
        target += ".npz"
    with zipfile.ZipFile(target, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in arrays.items():
            with archive.open(f"{name}.npy", mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=True)

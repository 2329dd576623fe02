"""Files written whole or not at all: JSON through a temporary sibling and `os.replace`."""

from __future__ import annotations

import enum
import json
import os
import secrets
from pathlib import Path
from typing import Any


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

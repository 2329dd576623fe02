"""`identity` backend: echoes its inputs as outputs and computes nothing (a transport-ceiling reference).

Serves a version folder holding only `identity.json`, which declares the contract:
`{"inputs": {"x": {"dtype": "float32", "shape": [null, 784]}}}` (null = unknown dimension). Every
input is returned under the same alias, so the response carries as many bytes as the request.
A benchmark and test fixture, not a production backend: `register()` adds it to the serving registry
(last, so `auto` picks it only for folders with no real model artifact), and `python -m bench.serve.identity
serve ...` is `python -m tfship.serving serve ...` with it registered (what the benchmark and tests start).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from tfship.core.contract import Signature, TensorSpec
from tfship.serving.runtimes import REGISTRY
from tfship.serving.runtimes.base import Runtime, RuntimeLoadError


class IdentityRuntime(Runtime):
    """Returns `inputs` unchanged for `serving_default`; cost per call is a dict copy (no array copy)."""

    name = "identity"
    FILE = "identity.json"

    def __init__(self, version_dir: Path, options=None) -> None:
        super().__init__(version_dir, options)
        self._signature: Signature | None = None

    @classmethod
    def can_serve(cls, version_dir: Path) -> bool:
        return (Path(version_dir) / cls.FILE).is_file()

    def load(self) -> None:
        path = self.version_dir / self.FILE
        try:
            declared = json.loads(path.read_text())["inputs"]
            specs = {
                alias: TensorSpec(
                    dtype=str(np.dtype(s["dtype"])),
                    tensor_name=f"{alias}:0",
                    shape=None if s.get("shape") is None else tuple(s["shape"]),
                )
                for alias, s in declared.items()
            }
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise RuntimeLoadError(
                f"cannot load {path}: {err}; expected "
                '{"inputs": {"<alias>": {"dtype": "float32", "shape": [null, 784]}}}'
            ) from err
        self._signature = Signature(name="serving_default", inputs=specs, outputs=specs)
        self.ready = True

    def predict(self, inputs: Mapping[str, np.ndarray],
                signature_name: str = "serving_default") -> dict[str, np.ndarray]:
        """Return `inputs` as the outputs (same aliases, same arrays)."""
        return dict(inputs)

    def metadata(self) -> dict[str, Signature]:
        return {"serving_default": self._signature} if self._signature else {}


def register() -> None:
    """Add the `identity` backend to `serving.runtimes.REGISTRY` (once; a second call does nothing)."""
    if IdentityRuntime.name not in REGISTRY.names():
        REGISTRY.register(IdentityRuntime.name, IdentityRuntime)


def main(argv: list[str] | None = None) -> int:
    """`python -m tfship.serving ...` with the `identity` backend registered; returns the exit code."""
    register()
    from tfship.serving import cli

    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())

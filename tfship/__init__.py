"""tfship: train, export, convert, prove and serve TensorFlow models.

Everything tfship installs is importable under this one name; the repository's top-level folders are its
subpackages (`tfship.core` is the folder `core/`, and likewise `tfship.serving`, `tfship.pipeline`,
`tfship.signatures`, `tfship.tflite`, `tfship.tfjs`, `tfship.onnx_format`, `tfship.deploy`). In a checkout this
folder links each of them (`tfship/core -> ../core`), so the names resolve by path for Python and static tools
alike; the wheel and the editable install map them by pyproject.toml's `[tool.setuptools.package-dir]`
(docs/architecture.md, "One import name").

The Python API (`tfship.pipeline.api`) is re-exported here and loaded on first use, so `import tfship` imports
neither TensorFlow nor the server:

    result = tfship.ship(model, (x, y), repository="models")   # export -> convert -> validate -> publish
    with tfship.serve(result) as served:                        # a real server on loopback ports
        tfship.Client(served.grpc, result.model_name).predict(x[:4])

`ship`, `train`, `export`, `convert`, `validate`, `publish` and `inspect` need the pipeline extra
(TensorFlow); `serve` and `Client` work in the TensorFlow-free base install.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ship": "tfship.pipeline.api.ship",
    "configure": "tfship.pipeline.api.ship",
    "train": "tfship.pipeline.api.stages",
    "export": "tfship.pipeline.api.stages",
    "convert": "tfship.pipeline.api.stages",
    "validate": "tfship.pipeline.api.stages",
    "publish": "tfship.pipeline.api.stages",
    "inspect": "tfship.pipeline.api.inspection",
    "ShipResult": "tfship.pipeline.api.results",
    "StageResult": "tfship.pipeline.api.results",
    "ArtifactResult": "tfship.pipeline.api.results",
    "Inspection": "tfship.pipeline.api.results",
    "serve": "tfship.pipeline.api.serve",
    "Served": "tfship.pipeline.api.serve",
    "Client": "tfship.pipeline.api.client",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tfship' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

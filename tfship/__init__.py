"""tfship: train, export, convert, prove and serve TensorFlow models.

Everything tfship installs is importable under this one name; the repository's top-level folders are its
subpackages (`tfship.core` is the folder `core/`, and likewise `tfship.serving`, `tfship.pipeline`,
`tfship.signatures`, `tfship.tflite`, `tfship.tfjs`, `tfship.onnx_format`, `tfship.deploy`), mapped by pyproject.toml's
`[tool.setuptools.package-dir]` with no links: the wheel holds them under `tfship/`, and the editable install
(`make setup`) finds them through the same mapping (docs/architecture.md, "One import name").

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
from pathlib import Path
from typing import Any

# Imported from a checkout (the repository root on sys.path, e.g. a server started there by an interpreter whose
# installed tfship this folder shadows): the subpackages are this folder's siblings, as pyproject.toml's
# package-dir maps them. Only a checkout has them there; an installed tfship holds them inside this folder.
_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "core" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))

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

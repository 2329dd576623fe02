"""The package list of the one import name `tfship` (everything else is in pyproject.toml).

pyproject.toml's `[tool.setuptools.package-dir]` maps each subpackage to its top-level folder
(`"tfship.core" = "core"`). setuptools needs every package below them named too; this finds them folder by
folder, as pyproject's namespace `find` did: data-only folders (`tfjs/node`, `deploy/k8s`) are packages as
well, so their files ship under `[tool.setuptools.package-data]`. A mapped folder that is absent (the
Dockerfile's dependency stage builds from pyproject.toml and an empty `tfship/`) is skipped.
"""

import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, setup

ROOT = Path(__file__).resolve().parent
NOT_PACKAGES = ["*node_modules*", "*__pycache__*"]


def mapped_packages() -> list[str]:
    """`tfship`, each mapped subpackage, and every package folder below each (names under `tfship.`)."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    packages = []
    for name, folder in package_dir.items():
        if (ROOT / folder / "__init__.py").is_file():
            packages.append(name)
            packages += [f"{name}.{sub}" for sub in find_namespace_packages(str(ROOT / folder), exclude=NOT_PACKAGES)]
    return list(dict.fromkeys(packages))  # tfship/'s links (tfship/core -> ../core) find the same names again


setup(packages=mapped_packages())

"""The install paths match the floors: the base install is the server and client without TensorFlow.

`tests/serving/test_edge.py` installs with the README's command into a fresh venv and serves ONNX and
TFLite; these fast checks keep pyproject, the locks, the edge image and the README in agreement.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TF_PACKAGES = {"tensorflow", "tensorflow-cpu", "tf-keras", "keras", "tf2onnx", "tensorflow-serving-api"}


def _name(requirement: str) -> str:
    return re.split(r"[\[=<>!~ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[_name(name)] = version.strip()
    return pins


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_base_install_has_no_tensorflow_and_the_pipeline_extra_adds_it():
    base = {_name(r) for r in _project()["dependencies"]}
    assert not base & TF_PACKAGES, base & TF_PACKAGES
    assert {"onnxruntime", "ai-edge-litert", "grpcio", "protobuf", "numpy"} <= base
    pipeline = {_name(r) for r in _project()["optional-dependencies"]["pipeline"]}
    assert {"tensorflow", "keras", "tf2onnx", "onnx", "scikit-learn"} <= pipeline


def test_every_dependency_is_pinned_as_in_the_locks():
    lock = _pins(ROOT / "requirements.lock")
    extras = _project()["optional-dependencies"]
    for requirement in [*_project()["dependencies"], *extras["pipeline"], *extras["dev"]]:
        name, version = _name(requirement), requirement.split("==", 1)[1]
        assert lock.get(name) == version, f"{requirement}: requirements.lock has {lock.get(name)}"


def test_edge_image_installs_tfship_instead_of_copying_sources():
    dockerfile = (ROOT / "Dockerfile").read_text()
    edge_stage = dockerfile.split("FROM builder AS edge-deps", 1)[1].split("\nFROM ", 1)[0]
    assert "pip install -c /tmp/deps/requirements.lock /tmp/deps\n" in edge_stage
    assert "pip install --no-deps --force-reinstall /tmp/tfship " in edge_stage
    for stage in ("FROM ${BASE_IMAGE} AS edge-root", "FROM scratch AS edge"):
        edge = dockerfile.split(stage, 1)[1].split("\nFROM ", 1)[0]
        assert "--from=app" not in edge and "/opt/tfship/src" not in edge and "--from=source" not in edge


def test_readme_documents_both_commands():
    readme = (ROOT / "README.md").read_text()
    assert "pip install -c requirements.lock ." in readme
    assert 'pip install -c requirements.lock ".[pipeline]"' in readme

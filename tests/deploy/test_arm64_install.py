"""The arm64 edge image installs only from the package's own lock (static: no engine, no network).

`make docker-edge PLATFORM=linux/arm64` builds the same Dockerfile target as amd64 with `--platform`, so the
arm64 path is the edge path: every `pip install` on it must be the package with requirements.lock as
constraints, from the default index, with no architecture branch installing anything else. Constraints only pin
what the lock lists, so the lock must also pin every package the install pulls in *on aarch64*: the dependency
closure of pyproject's dependencies, with environment markers evaluated for linux/aarch64 (a dependency that
only aarch64 needs would otherwise install unpinned).
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

from tests.deploy.test_dockerfile import _canonical, _pins, _pip_installs, _stages

ROOT = Path(__file__).resolve().parents[2]
EDGE_PATH = ("builder", "source", "edge-deps", "edge-root", "edge")  # the stages `--target edge` builds on
AARCH64 = {**default_environment(), "platform_machine": "aarch64", "sys_platform": "linux",
           "platform_system": "Linux", "os_name": "posix", "python_version": "3.11", "implementation_name": "cpython"}
FOREIGN_SOURCES = re.compile(r"--(extra-)?index-url|--find-links|\s-f\s|--trusted-host|https?://|\.whl\b|git\+")


def _closure(roots: list[str], environment: dict[str, str]) -> dict[str, str]:
    """{canonical name: the requirement that pulled it in} for `roots` and everything they need in `environment`,
    read from the installed distributions' metadata (the dev venv holds the lock's versions)."""
    seen: dict[str, str] = {}
    queue = [Requirement(r) for r in roots]
    while queue:
        requirement = queue.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({**environment, "extra": ""}):
            continue
        name = _canonical(requirement.name)
        if name in seen:
            continue
        seen[name] = str(requirement)
        queue.extend(Requirement(r) for r in importlib.metadata.distribution(name).requires or ())
    return seen


def test_the_arm64_build_is_the_edge_target_with_a_platform() -> None:
    """docker-edge takes PLATFORM as `--platform` (and a tag): same Dockerfile, same target, same installs."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^docker-edge:.*\n\t(.+)$", makefile, re.MULTILINE).group(1)
    assert recipe == "$(DEPLOY) build --target edge $(DOCKER_BUILD_ARGS) $(EDGE_PLATFORM_ARGS)"
    platform_args = re.search(r"^EDGE_PLATFORM_ARGS = (.+)$", makefile, re.MULTILINE).group(1)
    assert platform_args == "$(if $(PLATFORM),--platform $(PLATFORM) --image tfship:edge-$(PLATFORM_ARCH))"
    test_recipe = makefile.split("\ndocker-test-arm64:", 1)[1].split("\n\n", 1)[0]
    assert "docker-edge PLATFORM=linux/arm64" in test_recipe and "--target" not in test_recipe


def test_the_edge_path_installs_only_the_package_with_its_lock() -> None:
    stages = _stages()
    edge_installs = [(stage, args) for stage, args in _pip_installs() if stage in EDGE_PATH]
    assert sorted(args for _, args in edge_installs) == [
        "--no-deps --force-reinstall /tmp/tfship", "-c /tmp/deps/requirements.lock /tmp/deps"], edge_installs
    for stage in EDGE_PATH:
        text = " ".join(stages[stage])
        assert not FOREIGN_SOURCES.search(text), f"{stage} names another package source: {text}"
        assert not re.search(r"TARGETARCH|TARGETPLATFORM|uname -m|dpkg --print-architecture", text), (
            f"{stage} branches on the architecture")
        for command in ("apt-get install", "apt install", "pip download", "curl ", "wget ", "conda "):
            assert command not in text, f"{stage}: {command.strip()}"
    for script in ("slim-edge.sh", "build-base-image.sh", "ensure-binfmt.sh"):  # the scripts on the arm64 path
        body = (ROOT / "deploy" / "docker" / script).read_text()
        body = re.sub(r'(?m)^MIRROR="\$\{MIRROR:-[^}]*\}"$', "", body)  # debootstrap's Debian mirror, overridable
        assert not re.search(r"pip3? install|pip download|https?://", body), script


def test_the_lock_pins_everything_the_edge_install_needs_on_aarch64() -> None:
    lock = _pins(ROOT / "requirements.lock")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = _closure(project["dependencies"], AARCH64)
    unpinned = {name: why for name, why in needed.items() if name not in lock}
    assert not unpinned, f"the edge install on aarch64 needs packages requirements.lock does not pin: {unpinned}"
    for requirement in project["dependencies"]:  # and the package's own pins are the lock's
        name, _, version = requirement.partition("==")
        assert lock[_canonical(name)] == version, requirement
    assert {"onnxruntime", "ai-edge-litert", "numpy", "grpcio"} <= set(needed)


def test_the_closure_walk_sees_an_aarch64_only_dependency() -> None:
    """The check above can fail: a requirement with an aarch64 marker is followed, one for another machine is not
    (a package of the lock's stands in for the dependency)."""
    arm_only = _closure(['packaging; platform_machine == "aarch64"'], AARCH64)
    x86_only = _closure(['packaging; platform_machine == "x86_64"'], AARCH64)
    assert "packaging" in arm_only and "packaging" not in x86_only

"""`tfship deploy` argument handling, the container entry point and health check, without Docker."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tfship.deploy import cli as deploy

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "deploy" / "docker" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tfship")
    deploy.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["deploy", *argv])


def test_register_adds_build_run_stop() -> None:
    assert _parse("build", "--target", "edge").func is deploy.cmd_build
    assert _parse("run", "--target", "cloud").func is deploy.cmd_run
    assert _parse("stop", "--target", "edge").func is deploy.cmd_stop


def test_target_is_required_and_checked() -> None:
    with pytest.raises(SystemExit):
        _parse("build")
    with pytest.raises(SystemExit):
        _parse("build", "--target", "gpu")


def test_defaults_name_image_and_container_after_the_target() -> None:
    args = _parse("run", "--target", "edge")
    assert deploy._image(args) == "tfship:edge" and deploy._container(args) == "tfship-edge"
    assert (args.grpc_port, args.rest_port, args.metrics_port) == (8500, 8501, 9090)


class _FakeEngine:
    def __init__(self, bridge: bool) -> None:
        self._bridge = bridge

    def has_bridge(self) -> bool:
        return self._bridge


@pytest.mark.parametrize(("network", "bridge", "host"), [
    ("auto", True, False), ("auto", False, True), ("host", True, True), ("bridge", False, False)])
def test_network_choice(network: str, bridge: bool, host: bool) -> None:
    args = _parse("run", "--target", "edge", "--network", network, "--repository", "/srv/models")
    spec = deploy.run_spec(args, _FakeEngine(bridge))
    assert spec.host_network is host
    assert spec.repository == Path("/srv/models") and spec.model_name == "digits"


def test_importing_deploy_loads_neither_docker_nor_tensorflow() -> None:
    code = ("import sys, deploy.cli; "
            "sys.exit(any(m in sys.modules for m in ('docker', 'tensorflow', 'rich')))")
    assert subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT).returncode == 0


def test_entrypoint_maps_env_to_server_flags() -> None:
    entrypoint = _load("entrypoint")
    argv = entrypoint.server_argv({"MODEL_NAME": "digits", "MODEL_BASE_PATH": "/mnt/models", "GRPC_PORT": "9000",
                                   "MODEL_BACKEND": "tflite"}, ["--json-logs"])
    assert argv[1:3] == ["-m", "tfship.serving"]
    flags = dict(zip(argv[3:-1:2], argv[4::2]))
    assert flags["--repository"] == "/mnt/models" and flags["--model-name"] == "digits"
    assert flags["--port"] == "9000" and flags["--rest-port"] == "8501" and flags["--metrics-port"] == "9090"
    assert flags["--host"] == "0.0.0.0" and flags["--backend"] == "tflite"
    assert argv[-1] == "--json-logs"


def test_entrypoint_leaves_backend_to_the_server_when_unset() -> None:
    assert "--backend" not in _load("entrypoint").server_argv({"MODEL_BACKEND": ""}, [])


def test_entrypoint_flags_exist_in_the_server_cli() -> None:
    from tfship.serving.cli import add_serve_arguments

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    argv = _load("entrypoint").server_argv({"MODEL_BACKEND": "onnx"}, [])
    args = parser.parse_args(argv[3:])
    assert (args.port, args.rest_port, args.metrics_port, args.backend) == (8500, 8501, 9090, "onnx")


def test_entrypoint_serves_a_published_artifact_by_name() -> None:
    """MODEL_ARTIFACT=tflite_int8 becomes `--artifact tflite_int8`, a flag the server parses; unset, no flag."""
    from tfship.serving.cli import add_serve_arguments

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    entrypoint = _load("entrypoint")
    args = parser.parse_args(entrypoint.server_argv({"MODEL_ARTIFACT": "tflite_int8"}, [])[3:])
    assert (args.artifact, args.backend) == ("tflite_int8", "auto")
    assert "--artifact" not in entrypoint.server_argv({"MODEL_ARTIFACT": ""}, [])
    spec = deploy.run_spec(_parse("run", "--target", "edge", "--artifact", "tflite_int8"), _FakeEngine(True))
    assert spec.env == {"MODEL_ARTIFACT": "tflite_int8"}


def test_healthcheck_fails_when_nothing_listens(unused_tcp_port: int) -> None:
    result = subprocess.run([sys.executable, str(ROOT / "deploy" / "docker" / "healthcheck.py")],
                            env={"GRPC_PORT": str(unused_tcp_port), "HEALTH_TIMEOUT_S": "1"},
                            check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "UNAVAILABLE" in result.stdout or "DEADLINE_EXCEEDED" in result.stdout


@pytest.fixture
def unused_tcp_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_no_engine_is_a_deploy_error_that_says_how_to_start_one(monkeypatch, tmp_path: Path) -> None:
    from tfship.deploy.engine import DeployError, Engine

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-such.sock'}")
    with pytest.raises(DeployError, match="ensure-dockerd.sh") as caught:
        Engine.connect(timeout_s=5)
    assert caught.value.__cause__ is not None


def test_created_timestamp_parses_to_unix_seconds() -> None:
    from tfship.deploy.engine import _parse_ts

    assert _parse_ts("1970-01-01T00:01:40.123456789Z") == 99

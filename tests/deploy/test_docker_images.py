"""Both images, built and run for real against the published digits model (`make docker-test`).

For each image and backend: start the container on free ports, wait until its HEALTHCHECK (our
grpc.health.v1 probe) reports healthy, run `tfship query` from the host, send the version's golden
inputs and compare the answers with the outputs the pipeline validated, then `docker stop` it and
require exit code 0 (a clean SIGTERM drain, not a SIGKILL).

Needs a Docker engine (deploy/docker/ensure-dockerd.sh) and a published model: `models/digits/<n>/`
with `assets.extra/tfship_golden.npz` (`make pipeline`), or TFSHIP_DOCKER_REPOSITORY pointing at
another repository with the same layout.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.published_tolerance import check_published_parity
from tfship.deploy.engine import BuildResult, BuildSpec, Engine, Ports, RunSpec, Target

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
MODEL_NAME = os.environ.get("TFSHIP_DOCKER_MODEL_NAME", "digits")
GOLDEN = Path("assets.extra") / "tfship_golden.npz"
EDGE_BUDGET_BYTES = 250 * 1000 * 1000  # the whole edge image (issue 35: <= 250 MB on amd64; Docker counts 10^6)
# (target, how the server is told what to serve): the cloud image serves all three backends, the edge image the
# two without TF, and the int8 file by its published name (MODEL_ARTIFACT, `--artifact`).
CASES = [("cloud", {"MODEL_BACKEND": "saved_model"}), ("cloud", {"MODEL_BACKEND": "onnx"}),
         ("cloud", {"MODEL_BACKEND": "tflite"}), ("edge", {"MODEL_BACKEND": "tflite"}),
         ("edge", {"MODEL_BACKEND": "onnx"}), ("edge", {"MODEL_ARTIFACT": "tflite_int8"})]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def engine() -> Engine:
    return Engine.connect()


@pytest.fixture(scope="session")
def base_image(engine: Engine) -> str:
    return engine.resolve_base_image(os.environ.get("BASE_IMAGE") or None)


@pytest.fixture(scope="session")
def images(engine: Engine, base_image: str) -> dict[str, BuildResult]:
    """Build the three targets once per session (the engine's layer cache makes rebuilds quick)."""
    built = {}
    for target in Target:
        spec = BuildSpec(target=target, tag=f"tfship:{target}", base_image=base_image)
        built[target.value] = engine.build(spec)
        print(f"\n{spec.tag}: {built[target.value].size_bytes / 1e6:.0f} MB, built in "
              f"{built[target.value].seconds:.0f}s on {base_image}")
    return built


@pytest.fixture(scope="session")
def repository() -> Path:
    repo = Path(os.environ.get("TFSHIP_DOCKER_REPOSITORY", ROOT / "models"))
    versions = sorted((p for p in (repo / MODEL_NAME).glob("[0-9]*") if p.is_dir()), key=lambda p: int(p.name))
    assert versions, f"no published {MODEL_NAME} under {repo}: run `make pipeline` first"
    assert (versions[-1] / GOLDEN).is_file(), f"{versions[-1]} has no {GOLDEN} (not published by the pipeline?)"
    return repo


@pytest.fixture(scope="session")
def golden(repository: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The newest version's validated inputs and outputs."""
    version = max((p for p in (repository / MODEL_NAME).glob("[0-9]*") if p.is_dir()), key=lambda p: int(p.name))
    with np.load(version / GOLDEN) as data:
        inputs = {k.split(":", 1)[1]: data[k] for k in data.files if k.startswith("input:")}
        outputs = {k.split(":", 1)[1]: data[k] for k in data.files if k.startswith("output:")}
    return inputs, outputs


def newest_manifest(repository: Path) -> dict:
    """The newest published version's manifest.json."""
    version = max((p for p in (repository / MODEL_NAME).glob("[0-9]*") if p.is_dir()), key=lambda p: int(p.name))
    return json.loads((version / "manifest.json").read_text())


@pytest.fixture
def server(request, engine: Engine, images: dict[str, BuildResult], repository: Path) -> Iterator[RunSpec]:
    target, env = request.param
    spec = RunSpec(
        image=images[target].tag,
        name=f"tfship-test-{target}-{next(iter(env.values()))}".replace("_", "-"),
        repository=repository,
        model_name=MODEL_NAME,
        ports=Ports(grpc=_free_port(), rest=_free_port(), metrics=_free_port()),
        host_network=not engine.has_bridge(),
        env=env,
        health_interval_s=1.0,
    )
    started = time.monotonic()
    engine.run(spec)
    try:
        engine.wait_healthy(spec.name, timeout_s=240)
        print(f"\n{spec.name}: healthy after {time.monotonic() - started:.1f}s")
        yield spec
    finally:
        engine.remove(spec.name)


def test_edge_image_fits_its_budget(engine: Engine, images: dict[str, BuildResult], base_image: str) -> None:
    """The edge image is one layer cut down from the base by slim-edge.sh, so its whole size is what counts."""
    size = images["edge"].size_bytes
    assert size <= EDGE_BUDGET_BYTES, f"edge image is {size / 1e6:.0f} MB (base {base_image}: " \
                                      f"{engine.image_size(base_image) / 1e6:.0f} MB)"


def test_edge_image_has_no_tensorflow(engine: Engine, images: dict[str, BuildResult]) -> None:
    code = ("import importlib.util as u, sys; import tfship.serving, tfship.serving.cli, tfship.serving.server; "
            "missing=[m for m in ('ai_edge_litert','onnxruntime','grpc_health') if not u.find_spec(m)]; "
            "sys.exit(bool(u.find_spec('tensorflow')) or bool(missing) or 'tensorflow' in sys.modules)")
    assert engine.run_once(images["edge"].tag, ["python3", "-c", code]) == 0


def test_train_image_runs_tfship_with_the_pipeline(engine: Engine, images: dict[str, BuildResult]) -> None:
    """The training image's `tfship` has TensorFlow and the pipeline; the bundled config parses."""
    code = ("import tensorflow, tf2onnx, tfship.pipeline.cli, tfship.pipeline.config as c, pathlib; "
            "c.load_config(pathlib.Path('/opt/tfship/configs/digits.toml'))")
    assert engine.run_once(images["train"].tag, ["python3", "-c", code]) == 0
    assert engine.run_once(images["train"].tag, ["tfship", "--help"]) == 0


@pytest.mark.parametrize("server", CASES, indirect=True, ids=[f"{t}-{next(iter(e.values()))}" for t, e in CASES])
def test_serves_validated_answers_and_stops_cleanly(engine: Engine, server: RunSpec, golden, repository) -> None:
    target = f"127.0.0.1:{server.ports.grpc}"
    query = subprocess.run(
        [str(Path(sys.executable).parent / "tfship"), "query", "--target", target, "--model-name", MODEL_NAME,
         "--count", "20"],
        check=False, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert query.returncode == 0, f"tfship query failed:\n{query.stdout}\n{query.stderr}"
    assert "accuracy" in query.stdout

    from tfship.serving.tfs.client import PredictClient

    inputs, expected = golden
    with PredictClient(target, timeout_s=30) as client:
        got = client.predict(MODEL_NAME, inputs, signature_name="serving_default")
    assert set(expected) <= set(got), f"outputs {sorted(got)}, expected {sorted(expected)}"
    artifact = server.env.get("MODEL_ARTIFACT")
    if artifact == "tflite_int8":  # quantized: within what the gate published for it (tests/published_tolerance.py)
        assert check_published_parity(got, expected, newest_manifest(repository), artifact) == 2
        expected = {}
    for name, want in expected.items():
        if np.issubdtype(want.dtype, np.integer):
            np.testing.assert_array_equal(got[name], want, err_msg=name)
        else:
            # the tolerance the pipeline's parity gate used for float32 artifacts (configs/digits.toml)
            np.testing.assert_allclose(got[name], want, atol=1e-5, rtol=1e-5, err_msg=name)

    result = engine.stop(server.name, timeout_s=30)
    assert result.exit_code == 0, f"{server.name} exited {result.exit_code}:\n{result.log_tail}"
    assert result.seconds < 30, f"{server.name} needed {result.seconds:.0f}s to stop (SIGKILLed?)"

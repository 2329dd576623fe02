"""The arm64 edge image, run here under QEMU user emulation (`make docker-test-arm64`).

`make docker-edge PLATFORM=linux/arm64` builds `tfship:edge-arm64` on this amd64 machine (Debian's
qemu-user-static registered with binfmt_misc, base by `debootstrap --arch arm64`, no image pulled). For each
edge backend (ONNX; the float32 and the int8 TFLite files, chosen by their published names) the image serves
the published digits model; the answers to the version's golden inputs must match the SavedModel's as the
amd64 docker test requires (float32: its tolerance; int8: the tolerance the manifest published for it), and
the container must stop cleanly. Emulated speed means nothing: the times are printed, no throughput.

Needs a Docker engine with the image built, and a published model (see test_docker_images.py).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.published_tolerance import check_published_parity
from tfship.deploy.engine import Engine, Ports, RunSpec

pytestmark = [pytest.mark.docker, pytest.mark.arm64]

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("TFSHIP_DOCKER_ARM64_IMAGE", "tfship:edge-arm64")
MODEL_NAME = os.environ.get("TFSHIP_DOCKER_MODEL_NAME", "digits")
CASES = [{"MODEL_BACKEND": "onnx"}, {"MODEL_ARTIFACT": "tflite_float32"}, {"MODEL_ARTIFACT": "tflite_int8"}]
EMULATED_START_S = 300  # start-up under emulation on a busy 2-core machine (measured ~20-60 s; deploy/README.md)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def engine() -> Engine:
    engine = Engine.connect()
    assert engine.image_exists(IMAGE), f"no {IMAGE}: make docker-edge PLATFORM=linux/arm64"
    assert engine.image_platform(IMAGE) == "linux/arm64", f"{IMAGE} is {engine.image_platform(IMAGE)}"
    return engine


@pytest.fixture(scope="module")
def version() -> Path:
    repository = Path(os.environ.get("TFSHIP_DOCKER_REPOSITORY", ROOT / "models"))
    versions = sorted((p for p in (repository / MODEL_NAME).glob("[0-9]*") if p.is_dir()), key=lambda p: int(p.name))
    assert versions, f"no published {MODEL_NAME} under {repository}: run `make pipeline` first"
    return versions[-1]


def test_image_runs_arm64_code_without_tensorflow(engine: Engine) -> None:
    """The interpreter in the image is an aarch64 binary (run by QEMU here), with both runtimes and no TF."""
    code = ("import platform, sys, importlib.util as u; import onnxruntime, ai_edge_litert.interpreter; "
            "import tfship.serving.server; "
            "sys.exit(platform.machine() != 'aarch64' or u.find_spec('tensorflow') is not None)")
    started = time.monotonic()
    assert engine.run_once(IMAGE, ["python3", "-c", code]) == 0
    print(f"\nimports under emulation: {time.monotonic() - started:.1f}s")


@pytest.fixture
def server(request, engine: Engine, version: Path) -> Iterator[RunSpec]:
    spec = RunSpec(
        image=IMAGE,
        name=f"tfship-test-arm64-{next(iter(request.param.values()))}".replace("_", "-"),
        repository=version.parent.parent,
        model_name=MODEL_NAME,
        ports=Ports(grpc=_free_port(), rest=_free_port(), metrics=_free_port()),
        host_network=not engine.has_bridge(),
        env=request.param,
        health_interval_s=10.0,  # each probe is an emulated Python start (tens of seconds on a busy machine):
        health_timeout_s=90.0,  # not too often, and given the time it takes here (the image's 5 s suit a device)
    )
    started = time.monotonic()
    engine.run(spec)
    try:
        from tfship.serving.tfs.client import PredictClient

        with PredictClient(f"127.0.0.1:{spec.ports.grpc}", timeout_s=30) as client:
            client.wait_until_serving(EMULATED_START_S)  # the health Watch stream: no polling
        print(f"\n{spec.name}: SERVING after {time.monotonic() - started:.1f}s (emulated)")
        engine.wait_healthy(spec.name, timeout_s=EMULATED_START_S)  # and the image's own HEALTHCHECK agrees
        yield spec
    finally:
        engine.remove(spec.name)


@pytest.mark.parametrize("server", CASES, indirect=True, ids=[next(iter(c.values())) for c in CASES])
def test_serves_the_published_answers_under_emulation(engine: Engine, server: RunSpec, version: Path) -> None:
    from tfship.pipeline.orchestration.publish import read_golden_set
    from tfship.serving.tfs.client import PredictClient

    inputs, expected = read_golden_set(version)  # the SavedModel's answers, as the pipeline validated them
    started = time.monotonic()
    with PredictClient(f"127.0.0.1:{server.ports.grpc}", timeout_s=120) as client:
        got = client.predict(MODEL_NAME, inputs, signature_name="serving_default")
    print(f"{server.name}: {len(next(iter(inputs.values())))} rows answered in {time.monotonic() - started:.1f}s")
    assert set(expected) <= set(got), f"outputs {sorted(got)}, expected {sorted(expected)}"
    if server.env.get("MODEL_ARTIFACT") == "tflite_int8":
        manifest = json.loads((version / "manifest.json").read_text())
        assert check_published_parity(got, expected, manifest, "tflite_int8") == 2
        np.testing.assert_array_equal(got["class_id"], np.argmax(got["logits"], axis=-1))
    else:
        for name, want in expected.items():
            if np.issubdtype(want.dtype, np.integer):
                np.testing.assert_array_equal(got[name], want, err_msg=name)
            else:  # the float32 gate's tolerance, as the amd64 docker test (configs/digits.toml)
                np.testing.assert_allclose(got[name], want, atol=1e-5, rtol=1e-5, err_msg=name)

    result = engine.stop(server.name, timeout_s=60)
    assert result.exit_code == 0, f"{server.name} exited {result.exit_code}:\n{result.log_tail}"

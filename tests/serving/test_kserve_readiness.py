"""Open Inference Protocol readiness in-process: model and server readiness follow the versions and draining."""

from __future__ import annotations

import asyncio
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from conftest import MODEL

from tfship.core.errors import ModelNotFoundError
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import from_repository
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.types import ModelRef, ServerLimits
from tfship.serving.operations.metrics import Metrics
from tfship.serving.rest_port import build_app
from tfship.serving.runtimes import RuntimeOptions


def _publish(repository: Path, root: Path, version: int, broken: bool = False) -> None:
    staging = root / MODEL / f".staging-{version}"
    shutil.copytree(repository / MODEL / str(version), staging)
    if broken:
        (staging / "model.tflite").write_bytes(b"not a flatbuffer")
    staging.rename(root / MODEL / str(version))


async def _ready_answers(dataplane: DataPlane) -> list[tuple[int, dict]]:
    async with TestClient(TestServer(build_app(dataplane))) as http:
        answers = []
        for path in ("/v2/health/ready", f"/v2/models/{MODEL}/ready", "/v2/models/nope/ready"):
            response = await http.get(path)
            answers.append((response.status, await response.json()))
        return answers


def test_readiness_follows_available_versions_and_draining(repository, tmp_path):
    async def run():
        with ThreadPoolExecutor(2) as pool:
            manager = ModelManager("tflite", RuntimeOptions(), pool)
            dataplane = DataPlane(manager, pool, ServerLimits(), Metrics())
            assert not dataplane.server_ready()  # no model configured yet
            _publish(repository, tmp_path, 1, broken=True)
            await manager.apply_config(from_repository(tmp_path, MODEL))
            assert not dataplane.server_ready() and not dataplane.model_ready(ModelRef(MODEL))
            with pytest.raises(ModelNotFoundError, match="nope"):
                dataplane.model_ready(ModelRef("nope"))
            down = await _ready_answers(dataplane)
            _publish(repository, tmp_path, 2)
            await manager.reconcile()
            up = await _ready_answers(dataplane)
            versions = (dataplane.model_ready(ModelRef(MODEL, version=2)), dataplane.available_versions(ModelRef(MODEL)))
            dataplane.draining = True
            draining = (dataplane.server_ready(), dataplane.model_ready(ModelRef(MODEL)))
            await manager.unload_all()
            return down, up, versions, draining

    down, up, versions, draining = asyncio.run(run())
    assert down[:2] == [(503, {"ready": False}), (503, {"name": MODEL, "ready": False})]
    assert down[2][0] == 404 and "nope" in down[2][1]["error"]
    assert up[:2] == [(200, {"ready": True}), (200, {"name": MODEL, "ready": True})]
    assert versions == (True, [2])
    assert draining == (False, False)

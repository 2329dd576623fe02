"""Versions held and released from another transport's loop are never unloaded while held.

The REST API serves its requests on its own thread and loop (`serving.loops`), holding versions with
`ModelManager.hold` and releasing them there, while the manager loads and retires versions on the main loop.
Real parts: the `identity` backend behind a real `ModelManager`; a `TransportLoop` thread holds version after
version in a tight loop while the main loop publishes versions 2..6 and retires each previous one.
"""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.serve.identity import register
from tfship.core.errors import TfshipError
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import ModelConfig
from tfship.serving.dataplane.types import ModelRef, VersionState
from tfship.serving.loops import TransportLoop
from tfship.serving.runtimes import RuntimeOptions


def _publish(root: Path, version: int) -> None:
    folder = root / "echo" / str(version)
    folder.mkdir(parents=True)
    (folder / "identity.json").write_text(json.dumps({"inputs": {"x": {"dtype": "float32", "shape": [None, 4]}}}))


def test_a_version_held_on_another_loop_is_unloaded_only_once_released(tmp_path):
    register()
    _publish(tmp_path, 1)
    seen = {"holds": 0, "unloaded_while_held": 0, "versions": set()}
    stop = threading.Event()

    async def hold_forever(manager: ModelManager) -> None:
        while not stop.is_set():
            try:
                served = manager.hold(ModelRef("echo"))
            except TfshipError:
                await asyncio.sleep(0)
                continue
            try:
                seen["holds"] += 1
                seen["versions"].add(served.version)
                await asyncio.sleep(0)  # the request "runs": other threads go on meanwhile
                if served.runtime is None or served.state is not VersionState.AVAILABLE and served.inflight == 0:
                    seen["unloaded_while_held"] += 1
            finally:
                manager.release(served)

    async def scenario() -> list:
        with ThreadPoolExecutor(2) as pool:
            manager = ModelManager("identity", RuntimeOptions(), pool)
            await manager.apply_config([ModelConfig("echo", tmp_path / "echo")])
            rest = TransportLoop("rest-like")
            holder = asyncio.run_coroutine_threadsafe(hold_forever(manager), rest.loop)
            try:
                for version in range(2, 7):
                    await asyncio.sleep(0.05)
                    _publish(tmp_path, version)
                    shutil_old = tmp_path / "echo" / str(version - 1)
                    for child in shutil_old.iterdir():
                        child.unlink()
                    shutil_old.rmdir()  # retire the previous version
                    await asyncio.wait_for(manager.reconcile(), 30)
                await asyncio.sleep(0.05)
            finally:
                stop.set()
                holder.result(10)
                rest.stop()
            statuses = manager.statuses(ModelRef("echo"))
            await manager.unload_all()
            return statuses

    statuses = asyncio.run(scenario())
    assert seen["unloaded_while_held"] == 0
    assert seen["holds"] > 100 and len(seen["versions"]) >= 3, seen
    assert [(s.version, s.state) for s in statuses if s.state is VersionState.AVAILABLE] == [(6, VersionState.AVAILABLE)]

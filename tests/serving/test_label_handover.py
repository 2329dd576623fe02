"""A moved version label is answered at every moment of a model config reload (TF Serving's label semantics).

Real parts: the `identity` backend behind a real `ModelManager`. Versions 1 and 2 are on disk; the config serves
`specific {1}` labelled `stable`. The reload moves both the policy and the label to version 2. Spies on the
manager's own `_load` and `_unload` ask the real manager, at the moment each step starts, which version
`stable` answers: it must answer at every step (the old version while the new one loads, the new one before
the old one is unloaded).
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.serve.identity import register
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import ModelConfig, VersionPolicy
from tfship.serving.dataplane.types import ModelRef, VersionState
from tfship.serving.runtimes import RuntimeOptions

STABLE = ModelRef("echo", label="stable")


def _publish(root: Path, version: int) -> None:
    folder = root / "echo" / str(version)
    folder.mkdir(parents=True)
    (folder / "identity.json").write_text(json.dumps({"inputs": {"x": {"dtype": "float32", "shape": [None, 4]}}}))


def _config(root: Path, version: int, **labels: int) -> ModelConfig:
    return ModelConfig("echo", root / "echo", policy=VersionPolicy("specific", versions=(version,)), labels=labels)


async def _reload_watching_label(root: Path, first: ModelConfig, second: ModelConfig) -> list[tuple[str, int, int]]:
    """Apply `first`, then `second`; returns (step, version the step acts on, version `stable` answered)."""
    register()
    with ThreadPoolExecutor(2) as pool:
        manager = ModelManager("identity", RuntimeOptions(), pool)
        await manager.apply_config([first])
        seen: list[tuple[str, int, int]] = []
        real_load, real_unload = manager._load, manager._unload

        async def watched_load(model, version, path):
            seen.append(("load", version, manager.resolve(STABLE).version))
            await real_load(model, version, path)

        async def watched_unload(served, name):
            if served.state is VersionState.AVAILABLE:
                seen.append(("unload", served.version, manager.resolve(STABLE).version))
            await real_unload(served, name)

        manager._load, manager._unload = watched_load, watched_unload
        await manager.apply_config([second])
        seen.append(("after", 0, manager.resolve(STABLE).version))
        assert [s.version for s in manager.statuses(ModelRef("echo"))
                if s.state is VersionState.AVAILABLE] == [second.policy.versions[0]]
        manager._load, manager._unload = real_load, real_unload
        await manager.unload_all()
        return seen


@pytest.mark.parametrize("before, after", [(1, 2), (2, 1)], ids=["promotion", "rollback"])
def test_label_answers_while_it_moves(tmp_path: Path, before: int, after: int) -> None:
    """A promotion (the label moves up) and a rollback (it moves down, to a version not loaded before)."""
    _publish(tmp_path, 1)
    _publish(tmp_path, 2)
    seen = asyncio.run(_reload_watching_label(tmp_path, _config(tmp_path, before, stable=before),
                                              _config(tmp_path, after, stable=after)))
    assert seen == [("load", after, before), ("unload", before, after), ("after", 0, after)]

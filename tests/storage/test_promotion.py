"""`tfship promote`: labels move in the model config servers poll, `stable` only by evidence, every move recorded.

Three published versions: v1 (seed 0), v2 (seed 0 plus a bias on every logit: the same decisions, other
outputs) and v3 (seed 1: other decisions). The held-out labels are v1's own decisions, so v2 keeps the task
metric and v3 loses most of it. In a bucket, a server polling `s3://…/models.config` follows the labels.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tfship.core.locations import BucketUrl
from tfship.pipeline.orchestration.promote import PromotionRefusedError, history, promote
from tfship.pipeline.orchestration.publish import publish_version, write_golden_set
from tfship.serving.launcher import ServerProcess
from tfship.serving.runtimes import REGISTRY, RuntimeOptions
from tfship.serving.storage.filesystem import read_text
from tfship.serving.tfs.client import PredictClient

X = np.random.default_rng(3).random((64, 8, 8, 1), dtype=np.float32)


def _decisions(folder: Path) -> np.ndarray:
    runtime = REGISTRY.create("onnx", folder, RuntimeOptions(use_gpu=False))
    runtime.load()
    return runtime.predict({"image": X})["logits"].argmax(axis=1)


@pytest.fixture(scope="module")
def candidates(version_folders, tmp_path_factory) -> list[Path]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))
    import model_factory

    root = tmp_path_factory.mktemp("promotion")
    third = root / "c"
    model_factory.build_saved_model(third, seed=1, tflite=False)
    folders = []
    for index, source in enumerate((*version_folders, third)):
        folder = root / f"v{index + 1}"
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("assets.extra"))
        write_golden_set(folder, {"image": X[:8]}, {})
        folders.append(folder)
    return folders


def _publish_all(candidates: list[Path], repository) -> None:
    for number, folder in enumerate(candidates, start=1):
        assert publish_version(folder, repository, "digits", {"status": "test"}).version == number


def test_stable_moves_by_evidence_and_every_move_is_recorded(candidates, tmp_path: Path) -> None:
    repository = tmp_path / "models"
    _publish_all(candidates, repository)
    held_out = (X, _decisions(candidates[0]))
    assert promote(repository, "digits", 1, "stable", held_out=held_out)["evidence"] is None  # first: no baseline
    promote(repository, "digits", 2, "canary")
    config = (repository / "models.config").read_text()
    assert 'key: "stable"\n      value: 1' in config and 'key: "canary"\n      value: 2' in config
    assert "versions: 1\n        versions: 2" in config and str(repository.resolve() / "digits") in config
    moved = promote(repository, "digits", 2, "stable", held_out=held_out)
    assert moved["previous"] == 1 and moved["evidence"]["passed"] and moved["evidence"]["candidate_metric"] == 1.0
    assert moved["evidence"]["max_abs_diff"]["logits"] > 0.5  # outputs differ, decisions do not
    with pytest.raises(PromotionRefusedError, match=r"v3 is worse than stable v2: accuracy 0\.\d+ vs stable v2 "
                                                    r"1\.0000 on 64 held-out rows \(allowed drop 0\.01\)"):
        promote(repository, "digits", 3, "stable", held_out=held_out)
    assert 'key: "stable"\n      value: 2' in (repository / "models.config").read_text()  # nothing moved
    forced = promote(repository, "digits", 3, "stable", held_out=held_out, force=True, who="test")
    assert forced["forced"] and not forced["evidence"]["passed"] and forced["by"] == "test"
    assert [(r["label"], r["version"], r["forced"]) for r in history(repository, "digits")] == [
        ("stable", 1, False), ("canary", 2, False), ("stable", 2, False), ("stable", 3, True)]


@pytest.mark.slow
def test_servers_follow_labels_in_a_bucket(candidates, bucket, s3_env, tmp_path: Path) -> None:
    repository = BucketUrl(f"s3://{bucket}/models")
    _publish_all(candidates[:2], repository)
    promote(repository, "digits", 1, "stable")
    config = repository / "models.config"
    assert f'base_path: "{repository}/digits"' in read_text(config)
    env = {**s3_env, "TFSHIP_MODEL_CACHE_DIR": str(tmp_path / "cache")}
    args = ["--model-config-file", str(config), "--model_config_file_poll_wait_seconds", "0.5",
            "--file-system-poll-wait-seconds", "0.5", "--rest-port", "-1"]
    with ServerProcess(tmp_path, "digits", "onnx", args, env=env, startup_timeout_s=120) as server:
        client = PredictClient(server.grpc_target)
        first = client.predict("digits", {"image": X[:2]}, version_label="stable")["logits"]
        promote(repository, "digits", 2, "stable", held_out=(X, _decisions(candidates[0])))
        deadline = time.monotonic() + 30
        while True:
            now = client.predict("digits", {"image": X[:2]}, version_label="stable")["logits"]
            if not np.allclose(now, first):
                break
            assert time.monotonic() < deadline, "the server never followed the label"
            time.sleep(0.3)
    assert np.allclose(now - first, now[0, 0] - first[0, 0], atol=1e-4)  # v2 = v1 + a constant bias

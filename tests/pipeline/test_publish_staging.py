"""A publish killed mid-copy leaves a `.staging-*` folder; the next publish removes it (never a live one's)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tfship.pipeline.orchestration.publish import STALE_LEGACY_STAGING_S, publish_version, remove_stale_staging


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_next_publish_removes_stale_staging_only(tmp_path):
    root = tmp_path / "repo" / "m"
    killed = root / f".staging-{_dead_pid()}-0badc0de"
    live = root / f".staging-{os.getpid()}-11112222"
    old_legacy, new_legacy = root / ".staging-deadbeef", root / ".staging-cafef00d"
    for folder in (killed, live, old_legacy, new_legacy):
        folder.mkdir(parents=True)
        (folder / "saved_model.pb").write_bytes(b"half")
    past = time.time() - STALE_LEGACY_STAGING_S - 5
    os.utime(old_legacy, (past, past))
    candidate = tmp_path / "candidate"
    candidate.mkdir()
    (candidate / "saved_model.pb").write_bytes(b"pb")
    result = publish_version(candidate, tmp_path / "repo", "m", {})
    assert result.version == 1
    left = sorted(p.name for p in root.iterdir())
    assert left == sorted(["1", live.name, new_legacy.name]), left
    assert remove_stale_staging(root) == []  # nothing more to clean

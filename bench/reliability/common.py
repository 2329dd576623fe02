"""Shared pieces of `make reliability`: one row of the summary, the model repository, process-tree checks."""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MODEL = "digits"


@dataclass
class Row:
    """One attack's outcome: how many tries, how many failed, and what a failure was."""

    attack: str
    what: str
    tried: int = 0
    failed: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    notes: str = ""
    children: list[int] = field(default_factory=list)  # kill rows: processes below the victim at each kill

    def fail(self, why: str) -> None:
        """Count one failed try, keeping the first reasons."""
        self.failed += 1
        if len(self.failures) < 5:
            self.failures.append(why)

    def check(self, ok: bool, why: str) -> bool:
        """Count one try; a failed `ok` records `why`."""
        self.tried += 1
        if not ok:
            self.fail(why)
        return ok

    @property
    def verdict(self) -> str:
        """`pass` when something was tried and nothing failed."""
        return "pass" if self.tried and not self.failed else "FAIL"


def build_repository(work: Path, versions: int = 3) -> Path:
    """`<work>/source/digits/<v>/` for v in 1..versions (SavedModel + ONNX + TFLite + warm-up), built once."""
    source = work / "source"
    sys.path.insert(0, str(ROOT / "tests" / "serving"))
    import model_factory  # the test suite's tiny real model (TensorFlow, ONNX, TFLite)

    for version in range(1, versions + 1):
        folder = source / MODEL / str(version)
        if not (folder / "model.onnx").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            model_factory.build_version(folder, seed=0, bias=float(version - 1))
    return source


def copy_version(source: Path, version: int, repo: Path, as_version: int, corrupt: bool = False) -> Path:
    """Publish `source` version as `as_version` into `repo` atomically (staging folder + rename)."""
    staging = repo / MODEL / f".staging-{os.getpid()}-{as_version}"
    shutil.copytree(source / MODEL / str(version), staging)
    if corrupt:
        (staging / "model.onnx").write_bytes(b"corrupt: not an onnx protobuf")
    target = repo / MODEL / str(as_version)
    os.rename(staging, target)
    return target


def images(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The model's one input: float32 [rows, 8, 8, 1]."""
    return {"image": np.random.default_rng(seed).random((rows, 8, 8, 1), dtype=np.float32)}


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Wait until none of `pids` is alive; returns the survivors after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def rss_mb(pid: int) -> float:
    """Resident memory of `pid`, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait_admitted(metrics_url: str, calls: list, timeout_s: float = 10.0) -> bool:
    """Wait until every call in `calls` (gRPC futures) reached the server: answered already, or waiting in the
    batch queue (`tfship_batch_queue_depth`). True when they all did within `timeout_s`."""
    import re
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = urllib.request.urlopen(metrics_url + "/metrics", timeout=5).read().decode()
        queued = sum(float(v) for v in re.findall(r'^tfship_batch_queue_depth\{[^}]*\} (\S+)$', text, re.M))
        if queued + sum(call.done() for call in calls) >= len(calls):
            return True
        time.sleep(0.01)
    return False

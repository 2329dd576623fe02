"""kill -9 at random moments: the publisher, the server (with `--num-processes` workers), a parent holding a
serve-check server and a TFLite converter, and a whole `tfship run`. After each kill: no process of the
victim's tree survives, no half-written version is visible, and the next publish removes stale staging."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bench.reliability.common import MODEL, ROOT, Row, descendants, wait_gone
from tfship.core.manifest import VersionManifest
from tfship.pipeline.orchestration.publish import publish_version
from tfship.serving.launcher import ServerProcess

ORPHAN_WAIT_S = 15.0  # a child killed by its parent's death signal is gone well within this


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}


def _kill_tree(victim: subprocess.Popen, row: Row, label: str) -> None:
    """SIGKILL `victim` (snapshotting its tree first), then check that every descendant died with it."""
    tree = descendants(victim.pid)
    victim.kill()
    victim.wait()
    row.children.append(len(tree))
    survivors = wait_gone(tree, ORPHAN_WAIT_S)
    row.check(not survivors, f"{label}: {len(survivors)} of {len(tree)} child process(es) outlived the kill -9")
    for pid in survivors:  # never leave them behind on the machine
        os.kill(pid, signal.SIGKILL)


def _versions_complete(model_root: Path) -> str:
    """'' when every numeric version folder is complete (manifest lists files that all exist with their
    sizes), else what is wrong."""
    for folder in model_root.iterdir():
        if not folder.name.isdigit():
            continue
        manifest = folder / "manifest.json"
        if not manifest.is_file():
            return f"version {folder.name} has no manifest.json"
        for entry in VersionManifest.read(folder).files:
            path = folder / entry.path
            if not path.is_file() or path.stat().st_size != entry.size_bytes:
                return f"version {folder.name}: {entry.path} missing or truncated"
    return ""


def kill_publisher(source: Path, work: Path, tries: int) -> Row:
    """kill -9 a publishing process at a random moment; no partial version; the next publish cleans up."""
    row = Row("kill9_publisher", "kill -9 of the publisher at random moments")
    repo = work / "publish-repo"
    shutil.rmtree(repo, ignore_errors=True)
    code = ("import sys; from pathlib import Path; from pipeline.orchestration.publish import publish_version; "
            "publish_version(Path(sys.argv[1]), Path(sys.argv[2]), 'digits', {})")
    for _ in range(tries):
        proc = subprocess.Popen([sys.executable, "-c", code, str(source / MODEL / "1"), str(repo)], env=_env())
        time.sleep(random.uniform(0.0, 0.6))
        proc.kill()
        proc.wait()
        problem = _versions_complete(repo / MODEL) if (repo / MODEL).is_dir() else ""
        row.check(not problem, problem)
    publish_version(source / MODEL / "1", repo, MODEL, {})  # the next publish
    stale = sorted(p.name for p in (repo / MODEL).glob(".staging-*"))
    row.check(not stale, f"stale staging folders left after the next publish: {stale}")
    versions = sorted(int(p.name) for p in (repo / MODEL).iterdir() if p.name.isdigit())
    row.notes = f"{len(versions)} versions published between the kills; all complete"
    return row


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kill_server(source: Path, tries: int) -> Row:
    """kill -9 a `--num-processes 2` server during start-up, loading or serving: no worker survives, and a
    new server binds the same gRPC port without --reuse-port (nobody holds it)."""
    row = Row("kill9_server", "kill -9 of a --num-processes server at random moments")
    for attempt in range(tries):
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "tfship.serving", "serve", "--repository", str(source),
                                 "--model-name", MODEL, "--backend", "onnx", "--port", str(port), "--rest-port", "-1",
                                 "--num-processes", "2", "--file-system-poll-wait-seconds", "0"],
                                env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(random.uniform(0.5, 6.0))
        _kill_tree(proc, row, f"try {attempt}")
        try:
            with ServerProcess(source, MODEL, backend="onnx",
                               extra_args=("--port", str(port), "--rest-port", "-1", "--metrics-port", "-1")):
                row.check(True, "")
        except Exception as err:  # noqa: BLE001 (any failure to start here is the finding)
            row.check(False, f"try {attempt}: port {port} still held after the kill: {str(err)[-200:]}")
    return row


def kill_serve_check_parent(source: Path, work: Path, tries: int) -> Row:
    """kill -9 a parent that runs a serve-check server (`ServerProcess`) and a TFLite conversion at once."""
    row = Row("kill9_stage_children", "kill -9 of a parent holding a serve-check server and a TFLite converter")
    code = textwrap.dedent("""
        import sys, threading
        from pathlib import Path
        from tfship.serving.launcher import ServerProcess
        from tfship.tflite.convert import convert_tflite
        from tfship.tflite.modes import TfliteMode, TfliteOptions
        source, out = Path(sys.argv[1]), Path(sys.argv[2])
        convert = threading.Thread(target=convert_tflite, args=(
            source / "digits" / "1", out / "model.tflite", TfliteOptions(TfliteMode.FLOAT32), None, 300))
        convert.start()  # the converter child and the serve-check server run at the same time
        with ServerProcess(source, "digits", backend="saved_model", extra_args=("--rest-port", "-1")):
            convert.join()
    """)
    for attempt in range(tries):
        out = work / f"convert-{attempt}"
        proc = subprocess.Popen([sys.executable, "-c", code, str(source), str(out)], env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(random.uniform(1.5, 8.0))
        _kill_tree(proc, row, f"try {attempt}")
    return row


def kill_run(work: Path, tries: int) -> Row:
    """kill -9 a real `tfship run --epochs 1` at a random moment: no child survives, no partial version."""
    row = Row("kill9_run", "kill -9 of `tfship run` (1 epoch) at random moments")
    repo, runs = work / "run-repo", work / "runs"
    for attempt in range(tries):
        proc = subprocess.Popen([sys.executable, "-m", "tfship.pipeline.cli", "run", "--epochs", "1", "--repository",
                                 str(repo), "--runs-dir", str(runs)], cwd=ROOT, env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(random.uniform(8.0, 40.0))
        finished = proc.poll() is not None
        _kill_tree(proc, row, f"try {attempt}")
        problem = _versions_complete(repo / MODEL) if (repo / MODEL).is_dir() else ""
        row.check(not problem, f"try {attempt}: {problem}")
        if finished:
            row.notes = "a run finished before its kill"
    return row

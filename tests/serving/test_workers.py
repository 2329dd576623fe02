"""`--num-processes`: N workers share the ports, the parent forwards SIGTERM and exits 0 after they drained."""

from __future__ import annotations

import os

import numpy as np
from conftest import MODEL

from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs.client import PredictClient


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_num_processes_serves_and_drains_on_sigterm(repository):
    inputs = {"image": np.random.default_rng(0).random((2, 8, 8, 1), dtype=np.float32)}
    with ServerProcess(repository, MODEL, backend="onnx",
                       extra_args=("--num-processes", "2", "--file-system-poll-wait-seconds", "0")) as server:
        workers = server.ports["workers"]
        assert len(workers) == 2 and all(w["metrics"] for w in workers)
        with PredictClient(server.grpc_target) as client:
            for _ in range(4):
                assert client.predict(MODEL, inputs)["class_id"].shape == (2,)
        with PredictClient(f"127.0.0.1:{server.ports['grpc']}") as other:  # another connection, same port
            assert other.predict(MODEL, inputs)["class_id"].shape == (2,)
        code = server.stop()
    assert code == 0
    assert not any(_alive(w["pid"]) for w in workers)


def test_settings_accept_every_registered_backend():
    import subprocess
    import sys

    import pytest
    from pydantic import ValidationError

    from bench.serve.identity import register
    from tfship.serving.runtimes import backend_names
    from tfship.serving.settings import ServerSettings

    production = subprocess.run([sys.executable, "-c", "from serving.runtimes import backend_names; "
                                 "print(','.join(backend_names()))"], capture_output=True, text=True, check=True)
    assert production.stdout.split() == ["auto,saved_model,onnx,tflite"]  # identity is a benchmark fixture
    register()
    assert "identity" in backend_names()
    assert ServerSettings(backend="identity").backend == "identity"
    with pytest.raises(ValidationError, match="unknown backend 'nope'"):
        ServerSettings(backend="nope")


def _wait_for(predicate, timeout_s: float, what: str):
    import time

    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def test_crashed_worker_restarts_and_workers_die_with_a_killed_parent(repository, tmp_path):
    """kill -9 of a worker: it is restarted and serving goes on; kill -9 of the parent: no worker survives
    (QA found survivors holding the port and answering for an old model), and the parent's temp folder, which it
    could not remove, goes when the next server starts."""
    import json
    import signal
    from pathlib import Path

    from tfship.core.scratch import remove_orphaned_scratch

    temp = tmp_path / "temp"  # the parent's TMPDIR
    temp.mkdir()
    inputs = {"image": np.zeros((1, 8, 8, 1), np.float32)}
    with ServerProcess(repository, MODEL, backend="onnx", env={**os.environ, "TMPDIR": str(temp)},
                       extra_args=("--num-processes", "2", "--file-system-poll-wait-seconds", "0",
                                   "--grace-period-s", "2")) as server:
        port_file = Path(server.command()[server.command().index("--port-file") + 1])
        first = [w["pid"] for w in server.ports["workers"]]
        os.kill(first[0], signal.SIGKILL)

        def restarted():
            pids = [w["pid"] for w in json.loads(port_file.read_text())["workers"]]
            return pids if pids[0] != first[0] and all(_alive(p) for p in pids) else None

        second = _wait_for(restarted, 120, "the crashed worker to be restarted and ready")
        assert second[1] == first[1] and server.process.poll() is None
        with PredictClient(server.grpc_target) as client:
            for _ in range(4):
                assert client.predict(MODEL, inputs)["class_id"].shape == (1,)
        server.process.kill()
        server.process.wait()
        _wait_for(lambda: not any(_alive(p) for p in second), 2 + 10, "workers to exit after the parent died")
    left = list(temp.glob("tfship-workers-*"))
    assert len(left) == 1, left  # a SIGKILLed parent cannot clean up
    assert remove_orphaned_scratch(temp) == left  # what the next `tfship serve` runs at start


def test_num_processes_auto_is_one_worker_per_cpu_with_the_threads_split(tmp_path):
    """`--num-processes auto`: one worker per CPU of the process' CPU set; backend threads left at 0 are split."""
    import argparse

    import pytest

    from tfship.serving.cli import count_or_auto
    from tfship.serving.settings import ServerSettings
    from tfship.serving.workers import worker_settings

    cpus = len(os.sched_getaffinity(0))
    assert count_or_auto("auto") == count_or_auto("AUTO") == cpus and count_or_auto("3") == 3
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-processes", type=count_or_auto, default=1)
    assert parser.parse_args(["--num-processes", "auto"]).num_processes == cpus
    with pytest.raises(SystemExit):
        parser.parse_args(["--num-processes", "many"])
    base = ServerSettings(model_base_path=str(tmp_path), model_name=MODEL, num_processes=cpus)
    worker = worker_settings(base)
    assert worker.num_processes == 1 and worker.intra_op_threads == worker.inter_op_threads == 1
    two = worker_settings(base.model_copy(update={"num_processes": 1, "intra_op_threads": 0}))
    assert two.intra_op_threads == cpus  # one worker: the whole CPU set
    kept = worker_settings(base.model_copy(update={"intra_op_threads": 4, "inter_op_threads": 2}))
    assert (kept.intra_op_threads, kept.inter_op_threads) == (4, 2)  # set by the user: kept

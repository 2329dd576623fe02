"""The multi-worker checks that run before TensorFlow connects: TF_CONFIG validation, our own address, the
rendezvous on the chief's port (on loopback, workers as threads) and the one-line disagreement; and SIGTERM /
SIGINT in a real `tfship train` process (a checkpoint, then exit; at once while waiting for peers)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tests.pipeline.conftest import REPO_ROOT
from tfship.core.errors import ConfigError, StageError
from tfship.pipeline.training.agreement import disagreement
from tfship.pipeline.training.cluster import check_own_address, parse_tf_config
from tfship.pipeline.training.rendezvous import meet
from tfship.pipeline.training.supervise import StopRequest
from tfship.pipeline.training.workers import free_loopback_ports


def _config(workers, index=0, job="worker", chief=None):
    cluster = {"worker": workers} | ({"chief": chief} if chief else {})
    return json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})


@pytest.mark.parametrize(("raw", "expected"), [
    (None, "needs the TF_CONFIG environment variable"),
    ("{not json", "TF_CONFIG is not JSON"),
    (json.dumps({"cluster": {"worker": ["a:1"]}}), "expected an object with 'cluster' and 'task'"),
    (json.dumps({"cluster": {"worker": ["a:1"], "ps": ["b:2"]}, "task": {"type": "worker"}}), "['ps']"),
    (_config(["a:1", "b"]), "cluster.worker[1] = 'b' is not 'host:port'"),
    (_config(["a:1", "b:70000"]), "port in 1..65535"),
    (_config(["a:1", "a:1"]), "worker 1 and worker 0 have the same address a:1"),
    (_config(["a:1", "b:1"], index=2), "task worker 2 is not in the cluster (cluster.worker has 2 addresses"),
    (_config(["a:1"], job="evaluator"), "task must be"),
])
def test_malformed_tf_config_is_one_line(raw, expected):
    with pytest.raises(ConfigError) as caught:
        parse_tf_config(raw)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_the_chief_task_is_the_chief_and_comes_first():
    cluster = parse_tf_config(_config(["b:1", "c:1"], index=1, chief=["a:1"]))
    assert [t.name for t in cluster.tasks] == ["chief 0", "worker 0", "worker 1"]
    assert cluster.me.name == "worker 1" and cluster.rank == 2 and not cluster.is_chief
    assert parse_tf_config(_config(["b:1", "c:1"], index=0)).is_chief


def test_own_address_must_be_this_hosts_and_free():
    (port,) = free_loopback_ports(1)
    check_own_address(parse_tf_config(_config([f"127.0.0.1:{port}", "192.0.2.1:1"])))
    with pytest.raises(ConfigError, match=r"192\.0\.2\.1:1, which is not an address of this host"):
        check_own_address(parse_tf_config(_config([f"127.0.0.1:{port}", "192.0.2.1:1"], index=1)))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(ConfigError, match=f"port {port} is already in use"):
            check_own_address(parse_tf_config(_config([f"127.0.0.1:{port}"])))


def test_disagreement_names_what_differs_and_who_holds_it():
    rows = np.array([[42, 7, 0], [42, 8, 5], [42, 7, 0]])
    line = disagreement(["run.seed", "[train] settings", "starting step"], rows, ["worker 0", "worker 1", "worker 2"])
    assert line.startswith("train: the workers differ before the first step in [train] settings (worker 0, worker 2: ")
    assert "starting step (worker 0, worker 2: 0; worker 1: 5)" in line and "run.seed" not in line
    assert disagreement(["a"], np.array([[1], [1]]), ["worker 0", "worker 1"]) is None


def _meet_all(values: list[dict], timeout_s: float = 10.0, count: int | None = None):
    """Run `meet` for the first `count` workers of a loopback cluster of len(values), as threads."""
    ports = free_loopback_ports(len(values))
    results: dict[int, object] = {}

    def worker(index):
        cluster = parse_tf_config(_config([f"127.0.0.1:{p}" for p in ports], index))
        try:
            meet(cluster, values[index], timeout_s, StopRequest(), say=lambda _line: None)
            results[index] = "go"
        except StageError as err:
            results[index] = str(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count or len(values))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s + 15)
    assert not any(t.is_alive() for t in threads)
    return results, ports


def test_workers_that_agree_meet():
    results, _ = _meet_all([{"run.seed": 1, "starting step": 0}] * 3)
    assert results == {0: "go", 1: "go", 2: "go"}


def test_workers_that_differ_all_stop_with_the_same_line():
    results, _ = _meet_all([{"code version": 1, "starting step": 0}, {"code version": 1, "starting step": 12}])
    assert results[0] == results[1]
    assert "starting step (worker 0: 0; worker 1: 12)" in results[0]


def test_a_missing_worker_is_named_after_the_timeout():
    started = time.monotonic()
    results, ports = _meet_all([{"a": 1}, {"a": 1}], timeout_s=2.0, count=1)
    assert time.monotonic() - started < 8
    assert results[0] == (f"train: gave up after 2 s (train.cluster_timeout_s) connecting to the cluster; waiting "
                          f"for: worker 1 at 127.0.0.1:{ports[1]} (not connected yet)")


def _train_process(tmp_path, *extra, env_extra=None):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "COLUMNS": "200", "PYTHONPATH": str(REPO_ROOT),
           **(env_extra or {})}
    argv = [sys.executable, "-m", "tfship.pipeline.cli", "train", "--set", "model.kind=mlp", "--set",
            "train.jit_compile=false", "--set", "train.tensorboard=false", "--runs-dir", str(tmp_path / "runs"),
            *extra]
    return subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _read_until(proc, marker: str, timeout_s: float) -> str:
    """Read the process's output until a line holds `marker` (AssertionError after `timeout_s`)."""
    seen, deadline = [], time.monotonic() + timeout_s
    timer = threading.Timer(timeout_s, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            seen.append(line)
            if marker in line:
                return "".join(seen)
    finally:
        timer.cancel()
    raise AssertionError(f"{marker!r} not seen within {timeout_s} s (or the process ended):\n{''.join(seen)[-3000:]}"
                         if time.monotonic() < deadline else f"timed out:\n{''.join(seen)[-3000:]}")


@pytest.mark.slow
def test_sigterm_while_training_checkpoints_then_exits(tmp_path):
    proc = _train_process(tmp_path, "--epochs", "200", "--set", "train.checkpoint_every_steps=20")
    try:
        _read_until(proc, "checkpoint saved: step 20 ", 180)
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 2, rest[-3000:]
    (line,) = [x for x in rest.splitlines() if x.startswith("tfship train:")]
    assert "stopped by SIGTERM at step" in line and "continue with `tfship train --resume`" in line
    step = int(line.split(" at step ")[1].split()[0])
    (run,) = (tmp_path / "runs").iterdir()
    assert (run / "checkpoints" / f"ckpt-{step}.index").is_file()


@pytest.mark.slow
def test_ctrl_c_while_waiting_for_peers_ends_at_once(tmp_path):
    ports = free_loopback_ports(2)
    config = _config([f"127.0.0.1:{p}" for p in ports])
    proc = _train_process(tmp_path, "--set", "train.strategy=multi_worker", env_extra={"TF_CONFIG": config})
    try:
        _read_until(proc, f"waiting for worker 1 at 127.0.0.1:{ports[1]}", 180)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 2 and took < 5, (took, rest[-2000:])
    assert f"stopped by SIGINT while waiting for worker 1 at 127.0.0.1:{ports[1]}" in rest

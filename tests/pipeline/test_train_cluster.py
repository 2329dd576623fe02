"""The multi-worker checks that run before TensorFlow connects: TF_CONFIG validation, our own address, the
rendezvous on the chief's port (on loopback, workers as threads) and the one-line disagreement; and SIGTERM /
SIGINT delivered to this process while `train_model` runs in its main thread, as `tfship train` runs it (a
checkpoint, then a stop; at once while waiting for peers)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

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


def _config_with(**train):
    from tfship.pipeline.config import load_config

    return load_config(None, {"model.kind": "mlp", "model.hidden_units": [16], "train.jit_compile": False,
                              "train.tensorboard": False, **{f"train.{k}": v for k, v in train.items()}})


def test_sigterm_while_training_checkpoints_then_stops(splits, tmp_path):
    """In this process (main thread, as `tfship train` runs it): SIGTERM during step 20's checkpoint -> a
    checkpoint of that step, then StageError naming it."""
    from tfship.pipeline.training.train import TrainInputs, train_model

    sent = []

    def log(line: str) -> None:
        if line.startswith("checkpoint saved: step 20 ") and not sent:
            sent.append(line)
            os.kill(os.getpid(), signal.SIGTERM)  # handled before the loop's next check: it stops after step 20

    config = _config_with(epochs=50, checkpoint_every_steps=20)
    with pytest.raises(StageError) as caught:
        train_model(TrainInputs(config, splits, tmp_path / "checkpoints", log=log))
    message = str(caught.value)
    assert message.startswith("train: stopped by SIGTERM at step 20 of ") and "tfship train --resume" in message
    assert (tmp_path / "checkpoints" / "ckpt-20.index").is_file()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored


def test_ctrl_c_while_waiting_for_peers_ends_at_once(splits, tmp_path, monkeypatch):
    from tfship.pipeline.training.train import TrainInputs, train_model

    ports = free_loopback_ports(2)
    monkeypatch.setenv("TF_CONFIG", _config([f"127.0.0.1:{p}" for p in ports]))
    lines = []

    def log(line: str) -> None:
        lines.append(line)
        os.kill(os.getpid(), signal.SIGINT)  # at the first "waiting for" report

    started = time.monotonic()
    with pytest.raises(StageError) as caught:
        train_model(TrainInputs(_config_with(strategy="multi_worker"), splits, tmp_path / "checkpoints", log=log))
    assert time.monotonic() - started < 5 + 3  # the first report comes after 5 s
    assert lines == [f"worker 0: waiting for worker 1 at 127.0.0.1:{ports[1]} (not connected yet) (5 s of 300 s)"]
    assert str(caught.value) == (f"train: stopped by SIGINT while waiting for worker 1 at 127.0.0.1:{ports[1]} "
                                 "(not connected yet); nothing trained, no checkpoint written")

"""Multi-worker training across two simulated hosts: network namespaces the test makes and removes itself
(`tests/pipeline/train_hosts.py`), one `tfship` process per host, with `TF_CONFIG` as in docs/training.md
("Two hosts"). Every wait is bounded and every process is stopped by PID.

Covered: the happy path to publish (the Kubernetes recipe: deploy/k8s/train/job.yaml's pod script, only the
chief publishes); a restart from a SIGTERM checkpoint gives the
same weights as an uninterrupted run (deterministic = true); a worker killed and a link cut end the other
with one `tfship train:` line naming the lost task, exit 2 and a failed stage record; mismatched workers are
refused before the first step; a duplicate index / an address that is not the host's is refused at once and
the peer gives up within `train.cluster_timeout_s`, naming the missing task and address.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.pipeline.conftest import REPO_ROOT
from tests.pipeline.train_hosts import Hosts, namespaces_available, wait_all

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # minutes each: `make test-heavy`
_WHY_NOT = namespaces_available()
needs_namespaces = pytest.mark.skipif(_WHY_NOT is not None, reason=f"network namespaces unavailable: {_WHY_NOT}")

CONFIG = str(REPO_ROOT / "configs" / "digits-2workers.toml")
JOB_MANIFEST = REPO_ROOT / "deploy" / "k8s" / "train" / "job.yaml"
PORT = 23456
# The recipe's commands with a tiny model and short timeouts (the docs' recipe is the same command line).
FAST = ["--set", "model.kind=mlp", "--set", "model.hidden_units=[32]", "--set", "train.deterministic=true",
        "--set", "train.checkpoint_every_steps=4", "--set", "train.tensorboard=false",
        "--set", "train.cluster_timeout_s=30", "--epochs", "4"]
RUN_FAST = ["--set", 'convert.tflite_modes=["float32"]', "--set", "validate.batch_sizes=[1,7]"]
TOTAL_STEPS = 36  # 4 epochs x 9 steps of the global batch 128


def tf_config(addresses: list[str], index: int) -> str:
    """The docs' two-host TF_CONFIG: every worker at `<address>:23456`, this one at `index`."""
    return json.dumps({"cluster": {"worker": [f"{a}:{PORT}" for a in addresses]},
                       "task": {"type": "worker", "index": index}})


def _env(config: str) -> dict[str, str]:
    return {**os.environ, "TF_CONFIG": config, "TF_CPP_MIN_LOG_LEVEL": "3", "COLUMNS": "200",
            "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}  # log lines as they happen


def _start(hosts: Hosts, index: int, command: str, folder: Path, *extra: str, config: str | None = None,
           log: str | None = None):
    argv = [sys.executable, "-m", "tfship.pipeline.cli", command, "--config", CONFIG, *FAST, *extra,
            "--runs-dir", str(folder / "runs")]
    if command == "run":
        argv += [*RUN_FAST, "--repository", str(folder / "models")]
    return hosts.start(index, argv, _env(config or tf_config(hosts.addresses, index)), log or f"w{index}.log")


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout_s} s: {what}")
        time.sleep(0.2)


def _run_folder(folder: Path) -> Path:
    """The one run folder under `folder/runs` (or `folder` itself holding runs)."""
    runs = folder / "runs" if (folder / "runs").is_dir() else folder
    (run,) = runs.iterdir()
    return run


def _weights(run: Path) -> list[np.ndarray]:
    import keras

    return [np.asarray(w) for w in keras.models.load_model(run / "model.keras").get_weights()]


def _train_record(run: Path) -> dict:
    return {r["name"]: r for r in json.loads((run / "stages.json").read_text())}["train"]


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("tfship train:")]


def _pod_spec() -> tuple[str, dict[str, str], dict[str, int]]:
    """deploy/k8s/train/job.yaml's container script, its environment and the pods' DNS names (-> index)."""
    job = yaml.safe_load(JOB_MANIFEST.read_text())
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    names = {f"{env['TFSHIP_TRAIN_JOB']}-{i}.{env['TFSHIP_TRAIN_SERVICE']}": i
             for i in range(int(env["TFSHIP_TRAIN_WORKERS"]))}
    return container["args"][0], env, names


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The Kubernetes recipe, uninterrupted: the Indexed Job's pod script (job.yaml) run in two namespaces whose
    /etc/hosts give the pods' names, as the cluster DNS would; `tfship run` on both. Returns (work folder, logs).
    """
    root = tmp_path_factory.mktemp("hosts-ref")
    script, manifest_env, names = _pod_spec()
    assert len(names) == 2
    tiny = " ".join([*FAST, *RUN_FAST])
    with Hosts(2, root, names=names) as hosts:
        procs = []
        for i in range(2):
            env = {**_env(""), **manifest_env, "JOB_COMPLETION_INDEX": str(i), "TFSHIP_WORK": str(root / "work"),
                   "TFSHIP_TRAIN_ARGS": tiny, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                   "HOME": os.environ.get("HOME", "/root")}
            env.pop("TF_CONFIG")
            procs.append(hosts.start(i, ["sh", "-c", script], env, f"w{i}.log", cwd=REPO_ROOT))
        codes = wait_all(procs, 400)
        logs = [hosts.log(f"w{i}.log") for i in range(2)]
    assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)
    return root / "work", logs


@needs_namespaces
def test_the_kubernetes_pods_train_and_only_the_chief_publishes(reference):
    work, logs = reference
    chief = _run_folder(work / "runs" / "worker-0")
    train = json.loads((chief / "train.json").read_text())
    assert train["strategy"] == "multi_worker" and train["replicas"] == 2 and train["steps"] == TOTAL_STEPS
    (published,) = (work / "models" / "digits").iterdir()  # one version, from the chief only
    assert published.name == "1" and (published / "manifest.json").is_file()
    assert "worker 1 is not the chief" in logs[1] and "publishes" in logs[1]
    worker = _run_folder(work / "runs" / "worker-1")
    assert _train_record(worker)["status"] == "ok" and not (worker / "export.json").exists()


def _checkpoint_lines(log: str) -> list[int]:
    return [int(line.split("checkpoint saved: step ")[1].split()[0]) for line in log.splitlines()
            if "checkpoint saved: step " in line]


@needs_namespaces
def test_sigterm_and_a_killed_worker_end_cleanly_and_restarts_give_the_uninterrupted_weights(reference, tmp_path):
    """SIGTERM -> both checkpoint one step and exit; restart; SIGKILL one -> the other ends with one line; restart;
    the final weights equal the uninterrupted run's (deterministic = true)."""
    with Hosts(2, tmp_path) as hosts:
        procs = [_start(hosts, i, "train", tmp_path / f"host{i}") for i in range(2)]
        _wait_for(lambda: 4 in _checkpoint_lines(hosts.log("w1.log")), 240, "worker 1's first checkpoint")
        sent = time.monotonic()
        procs[1].send_signal(signal.SIGTERM)
        codes = wait_all(procs, 60)
        stopped_in = time.monotonic() - sent
        logs = [hosts.log(f"w{i}.log") for i in range(2)]
        assert codes == [2, 2], "\n".join(log[-3000:] for log in logs)
        assert stopped_in < 30, stopped_in
        lines = [_error_lines(log) for log in logs]
        assert all(len(found) == 1 and "stopped by SIGTERM on worker 1 at step" in found[0] for found in lines), lines
        (step,) = {int(found[0].split(" at step ")[1].split()[0]) for found in lines}  # the same on both
        assert step < TOTAL_STEPS
        for i in range(2):
            run = _run_folder(tmp_path / f"host{i}")
            assert (run / "checkpoints" / f"ckpt-{step}.index").is_file(), sorted(run.glob("checkpoints/*"))
            assert _train_record(run)["status"] == "failed"

        resumed = [_start(hosts, i, "train", tmp_path / f"host{i}", "--resume", log=f"r{i}.log") for i in range(2)]
        _wait_for(lambda: any(k > step for k in _checkpoint_lines(hosts.log("r1.log"))), 240,
                  "worker 1's first checkpoint after resuming")
        resumed[1].send_signal(signal.SIGKILL)
        started = time.monotonic()
        (code,) = wait_all(resumed[:1], 60)
        ended_in = time.monotonic() - started
        log = hosts.log("r0.log")
        assert code == 2, log[-3000:]
        assert ended_in < 30, ended_in
        (line,) = _error_lines(log)
        assert f"lost worker 1 at {hosts.addresses[1]}:{PORT}" in line, line
        assert "Traceback" not in log
        record = _train_record(_run_folder(tmp_path / "host0"))
        assert record["status"] == "failed" and "lost worker 1" in record["reason"]

        again = [_start(hosts, i, "train", tmp_path / f"host{i}", "--resume", log=f"a{i}.log") for i in range(2)]
        codes = wait_all(again, 300)
        assert codes == [0, 0], "\n".join(hosts.log(f"a{i}.log")[-3000:] for i in range(2))
    reference_weights = _weights(_run_folder(reference[0] / "runs" / "worker-0"))
    resumed_weights = _weights(_run_folder(tmp_path / "host0"))
    assert all(np.array_equal(a, b) for a, b in zip(reference_weights, resumed_weights, strict=True))


@needs_namespaces
def test_a_cut_link_ends_both_workers_with_one_line(tmp_path):
    with Hosts(2, tmp_path) as hosts:
        procs = [_start(hosts, i, "train", tmp_path / f"host{i}") for i in range(2)]
        _wait_for(lambda: 4 in _checkpoint_lines(hosts.log("w0.log")), 240, "worker 0's first checkpoint")
        hosts.cut(1)
        started = time.monotonic()
        codes = wait_all(procs, 60)
        ended_in = time.monotonic() - started
        logs = [hosts.log(f"w{i}.log") for i in range(2)]
    assert codes == [2, 2], "\n".join(log[-3000:] for log in logs)
    assert ended_in < 30 + 10, ended_in  # at the latest the cluster timeout, plus a margin for a shared machine
    for log, lost in zip(logs, (1, 0), strict=True):
        (line,) = _error_lines(log)  # TensorFlow's heartbeat notices first, else our cluster timeout
        assert f"worker {lost} at {hosts.addresses[lost]}:{PORT}" in line and ("lost" in line or "gave up" in line)
        assert "Traceback" not in log
    record = _train_record(_run_folder(tmp_path / "host0"))
    assert record["status"] == "failed" and f"worker 1 at {hosts.addresses[1]}" in record["reason"]


@needs_namespaces
def test_workers_that_differ_are_refused_before_the_first_step(tmp_path):
    with Hosts(2, tmp_path) as hosts:
        procs = [_start(hosts, 0, "train", tmp_path / "host0"),
                 _start(hosts, 1, "train", tmp_path / "host1", "--epochs", "5")]
        codes = wait_all(procs, 240)
        logs = [hosts.log(f"w{i}.log") for i in range(2)]
    assert codes == [2, 2], "\n".join(log[-2000:] for log in logs)
    for log in logs:
        (line,) = _error_lines(log)
        assert "workers differ before the first step in [train] settings" in line, line
        assert "starting step" not in line and "train step 1/" not in log


@needs_namespaces
def test_a_duplicate_index_is_refused_and_the_peer_gives_up_naming_it(tmp_path):
    with Hosts(2, tmp_path) as hosts:
        both_zero = tf_config(hosts.addresses, 0)
        procs = [_start(hosts, i, "train", tmp_path / f"host{i}", "--set", "train.cluster_timeout_s=12",
                        config=both_zero) for i in range(2)]
        started = time.monotonic()
        codes = wait_all(procs, 240)
        took = time.monotonic() - started
        logs = [hosts.log(f"w{i}.log") for i in range(2)]
    assert codes == [2, 2], "\n".join(log[-2000:] for log in logs)
    (refused,) = _error_lines(logs[1])
    assert f"worker 0 has address {hosts.addresses[0]}:{PORT}, which is not an address of this host" in refused
    (gave_up,) = _error_lines(logs[0])
    assert f"gave up after 12 s (train.cluster_timeout_s) connecting to the cluster; waiting for: worker 1 at " \
           f"{hosts.addresses[1]}:{PORT}" in gave_up, gave_up
    assert f"waiting for worker 1 at {hosts.addresses[1]}:{PORT}" in logs[0]  # reported while it waited
    assert took < 240, took  # importing TensorFlow on a shared machine, then the 12 s

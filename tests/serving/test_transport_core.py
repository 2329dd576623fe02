"""The transport threads share one core; the work they start that needs every core gets every core back.

Issue 21 (mixed load): with the gRPC and REST threads free to run on any core, the GIL crossed cores at every
handover and a mixed request cost about 1.45x its solo CPU. `serving.affinity` pins the serving threads to one
core. Inherited CPU sets are the risk: on Linux a thread or process starts with its starter's, so a model
loaded, or a decoding helper started, from a pinned thread would be confined to one core. Real parts: real
threads, a real `spawn`ed helper process (`Offloader`), and a real server whose threads are read from /proc.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tfship.serving.affinity import WORKER_INDEX_ENV, CoreShare, process_cpus
from tfship.serving.dataplane.offload import OFF_LOOP_BYTES, Offloader
from tfship.serving.launcher import ServerProcess

MODEL = "digits"
CPUS = frozenset(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="pinning needs 2 or more CPUs")


def _in_thread(function):
    """`function()` on a new thread; returns what it returned."""
    out = []
    thread = threading.Thread(target=lambda: out.append(function()))
    thread.start()
    thread.join(30)
    return out[0]


def test_join_pins_the_calling_thread_and_unpin_gives_every_cpu_back():
    cores = CoreShare()
    assert cores.core in CPUS and cores.cpus == CPUS

    def pinned_then_unpinned():
        cores.join()
        pinned = os.sched_getaffinity(0)
        cores.unpin()
        return pinned, os.sched_getaffinity(0)

    pinned, unpinned = _in_thread(pinned_then_unpinned)
    assert pinned == {cores.core}
    assert unpinned == CPUS
    assert os.sched_getaffinity(0) == CPUS  # the test's own thread was never touched


def test_executors_started_by_a_pinned_thread_choose_their_own_cpus():
    cores = CoreShare()
    loads, predicts = cores.executor(2), cores.executor(2, pinned=True)

    def from_pinned_thread():
        cores.join()  # a pinned thread starts the pools' threads (they would inherit its one core)
        return (loads.submit(os.sched_getaffinity, 0).result(30), predicts.submit(os.sched_getaffinity, 0).result(30))

    try:
        load_cpus, predict_cpus = _in_thread(from_pinned_thread)
    finally:
        loads.shutdown()
        predicts.shutdown()
    assert load_cpus == CPUS, "a model loaded from a transport thread would run on one core"
    assert predict_cpus == {cores.core}


def test_a_decoding_helper_started_from_a_pinned_thread_runs_on_every_cpu():
    cores = CoreShare()
    offloader = Offloader()

    def from_pinned_loop():
        cores.join()
        return asyncio.run(offloader.run_if_large(OFF_LOOP_BYTES + 1, os.sched_getaffinity, 0))

    try:
        assert _in_thread(from_pinned_loop) == CPUS
    finally:
        offloader.close()


def test_disabled_worker_index_and_spread(monkeypatch):
    assert CoreShare(enabled=False).core is None
    CoreShare(enabled=False).join()  # no core: nothing happens
    assert os.sched_getaffinity(0) == CPUS
    ordered = sorted(process_cpus())
    for index in (0, 1, len(ordered) + 1):
        monkeypatch.setenv(WORKER_INDEX_ENV, str(index))
        assert CoreShare().core == ordered[index % len(ordered)]  # --num-processes worker i: the i-th core


def _thread_cpus(pid: int) -> dict[int, tuple[str, frozenset[int]]]:
    """Each thread of `pid`: (its name in /proc, its CPU set)."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
        threads[int(task.name)] = (status["Name"].strip(), _cpu_list(status["Cpus_allowed_list"].strip()))
    return threads


def _cpu_list(text: str) -> frozenset[int]:
    cpus = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return frozenset(cpus)


def _children(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(proc.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def test_a_server_pins_its_transport_threads_and_nothing_that_runs_models(repository):
    body = json.dumps({"instances": np.random.default_rng(0).random((1000, 8, 8, 1)).tolist()}).encode()
    assert len(body) > OFF_LOOP_BYTES  # decoded in the helper process
    with ServerProcess(repository, MODEL, backend="tflite") as server:
        request = urllib.request.Request(f"{server.rest_url}/v1/models/{MODEL}:predict", data=body)
        with urllib.request.urlopen(request, timeout=60) as reply:
            assert len(json.loads(reply.read())["predictions"]) == 1000
        pid = server.process.pid
        threads = _thread_cpus(pid)
        helpers = [child for child in _children(pid)
                   if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes()]
        helper_cpus = [_thread_cpus(child)[child][1] for child in helpers]
    main_cpus = threads[pid][1]
    assert len(main_cpus) == 1, f"the gRPC thread runs on {sorted(main_cpus)}"
    on_core = [tid for tid, (_, cpus) in threads.items() if cpus == main_cpus]
    assert len(on_core) >= 2, "the REST thread is not on the gRPC thread's core"
    grpc_core_threads = [cpus for name, cpus in threads.values() if name.startswith("event_engine")]
    assert grpc_core_threads and all(cpus == CPUS for cpus in grpc_core_threads)
    assert any(cpus == CPUS for name, cpus in threads.values() if name == "python"), \
        "the model-loading threads should keep every CPU"
    assert helper_cpus == [CPUS], f"decoding helper on {helper_cpus}"


def test_spread_transport_threads_leaves_them_to_the_os(repository):
    with ServerProcess(repository, MODEL, backend="tflite", extra_args=["--spread-transport-threads"]) as server:
        threads = _thread_cpus(server.process.pid)
    assert all(cpus == CPUS for _, cpus in threads.values()), threads

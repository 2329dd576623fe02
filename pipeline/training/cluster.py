"""The multi-worker cluster from `TF_CONFIG`, checked before TensorFlow connects to anything.

`read_cluster()` parses and validates `TF_CONFIG` (`{"cluster": {"worker": ["host:port", ...],
"chief": [...]}, "task": {"type": "worker", "index": i}}`): only `chief` and `worker` jobs, every
address `host:port` with a port in 1..65535, no address twice, our own task inside the cluster.
`check_own_address(cluster)` then binds our own address for a moment: an address that is not one of
this host's (a wrong `index`, a copied `TF_CONFIG`) or a port already taken (two workers with the
same index on one host) is refused by name instead of hanging in the rendezvous. `probe(task)` tells
whether a peer's port accepts TCP connections right now (the waiting and lost-peer messages use it).

Everything here is plain Python (no TensorFlow) and raises `ConfigError` with one line naming the
task and address.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
from dataclasses import dataclass

from tfship.core.errors import ConfigError

JOBS = ("chief", "worker")  # coordination order: the chief (when there is one) is task 0 of the cluster
_HOST = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)$")
TF_CONFIG_EXAMPLE = ('{"cluster": {"worker": ["host-a:12345", "host-b:12345"]}, '
                     '"task": {"type": "worker", "index": 0}}')


@dataclass(frozen=True)
class Task:
    """One task of the cluster: its job (`chief` / `worker`), index in that job and `host:port` address."""

    job: str
    index: int
    address: str

    @property
    def name(self) -> str:
        """`worker 1` / `chief 0`, as messages name it."""
        return f"{self.job} {self.index}"

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])


@dataclass(frozen=True)
class Cluster:
    """The validated cluster: every task, ours (`me`), and whether we are the chief.

    The chief is the `chief` task when the cluster has one, else `worker 0`; it writes the results.
    """

    tasks: tuple[Task, ...]
    me: Task
    jobs: dict[str, list[str]]

    @property
    def is_chief(self) -> bool:
        return self.me == self.chief

    @property
    def chief(self) -> Task:
        return self.tasks[0]

    @property
    def peers(self) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if t != self.me)

    @property
    def size(self) -> int:
        return len(self.tasks)

    @property
    def rank(self) -> int:
        """Our position in `tasks` (chief first, then workers by index)."""
        return self.tasks.index(self.me)

    def rank_of(self, task: Task) -> int:
        return self.tasks.index(task)


def parse_tf_config(raw: str | None) -> Cluster:
    """Validate a `TF_CONFIG` JSON text into a `Cluster`.

    Raises:
        ConfigError: missing or malformed JSON, an unknown job, a malformed or repeated address, or a task
            outside the cluster; the message names the field and value.
    """
    if not raw:
        raise ConfigError("train.strategy = 'multi_worker' needs the TF_CONFIG environment variable (e.g. "
                          f"{TF_CONFIG_EXAMPLE}); on one machine, `tfship train --workers N` sets it per worker")
    try:
        tf_config = json.loads(raw)
    except ValueError as err:
        raise ConfigError(f"TF_CONFIG is not JSON ({err}); expected e.g. {TF_CONFIG_EXAMPLE}") from None
    if not isinstance(tf_config, dict) or not isinstance(tf_config.get("cluster"), dict) \
            or not isinstance(tf_config.get("task"), dict):
        raise ConfigError(f"TF_CONFIG: expected an object with 'cluster' and 'task'; got {raw[:200]!r}")
    jobs = tf_config["cluster"]
    unknown = sorted(set(jobs) - set(JOBS))
    if unknown:
        raise ConfigError(f"TF_CONFIG: cluster job(s) {unknown} are not used by multi_worker training; "
                          f"expected only {list(JOBS)}")
    if not jobs.get("worker") and not jobs.get("chief"):
        raise ConfigError("TF_CONFIG: cluster.worker lists no address")
    if len(jobs.get("chief", [])) > 1:
        raise ConfigError(f"TF_CONFIG: cluster.chief holds {len(jobs['chief'])} addresses; at most one")
    tasks, seen = [], {}
    for job in JOBS:
        addresses = jobs.get(job, [])
        if not isinstance(addresses, list):
            raise ConfigError(f"TF_CONFIG: cluster.{job} must be a list of 'host:port'; got {addresses!r}")
        for index, address in enumerate(addresses):
            task = Task(job, index, _checked_address(address, f"cluster.{job}[{index}]"))
            if task.address in seen:
                raise ConfigError(f"TF_CONFIG: {task.name} and {seen[task.address].name} have the same address "
                                  f"{task.address}; every task needs its own host:port")
            seen[task.address] = task
            tasks.append(task)
    task = tf_config["task"]
    job, index = task.get("type"), task.get("index", 0)
    if job not in JOBS or not isinstance(index, int) or isinstance(index, bool):
        raise ConfigError(f"TF_CONFIG: task must be {{'type': 'chief'|'worker', 'index': int}}; got {task!r}")
    mine = [t for t in tasks if t.job == job and t.index == index]
    if not mine:
        size = len(jobs.get(job, []))
        raise ConfigError(f"TF_CONFIG: task {job} {index} is not in the cluster (cluster.{job} has {size} "
                          f"address{'es' if size != 1 else ''}: indices 0..{size - 1})")
    return Cluster(tuple(tasks), mine[0], {j: list(jobs.get(j, [])) for j in JOBS if jobs.get(j)})


def _checked_address(address, where: str) -> str:
    if not isinstance(address, str) or ":" not in address:
        raise ConfigError(f"TF_CONFIG: {where} = {address!r} is not 'host:port'")
    host, _, port = address.rpartition(":")
    if not _HOST.match(host) or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"TF_CONFIG: {where} = {address!r} is not 'host:port' (a host name or address, and a "
                          "port in 1..65535)")
    return address


def read_cluster() -> Cluster:
    """`parse_tf_config` of the `TF_CONFIG` environment variable."""
    return parse_tf_config(os.environ.get("TF_CONFIG"))


def check_own_address(cluster: Cluster) -> None:
    """Bind our own task's address for a moment (then release it) to refuse, before connecting, an address
    that is not this host's or a port another process holds.

    Raises:
        ConfigError: the host does not resolve, is not an address of this host, or the port is in use.
    """
    me = cluster.me
    try:
        infos = socket.getaddrinfo(me.host, me.port, type=socket.SOCK_STREAM)
    except OSError as err:
        raise ConfigError(f"TF_CONFIG: our own task {me.name} has address {me.address}, whose host does not "
                          f"resolve ({err.strerror or err})") from None
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT of an earlier run is no owner
        try:
            sock.bind(sockaddr)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise ConfigError(f"TF_CONFIG: our own task {me.name} at {me.address}: port {me.port} is already in "
                                  "use on this host (another worker with the same index?)") from None
            if err.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(f"TF_CONFIG: our own task {me.name} has address {me.address}, which is not an "
                                  f"address of this host ({sockaddr[0]}); is task.index right?") from None
            raise ConfigError(f"TF_CONFIG: cannot bind our own address {me.address}: {err.strerror}") from None


def probe(task: Task, timeout_s: float = 1.0) -> str | None:
    """None when `task`'s port accepts a TCP connection now, else why not (`connection refused`, `timed out`,
    `host does not resolve`, ...).
    """
    try:
        with socket.create_connection((task.host, task.port), timeout=timeout_s):
            return None
    except TimeoutError:
        return "timed out"
    except socket.gaierror as err:
        return f"host does not resolve ({err.strerror})"
    except OSError as err:
        return (err.strerror or str(err)).lower()


def describe_unreachable(tasks: tuple[Task, ...], timeout_s: float = 1.0) -> list[str]:
    """`worker 1 at host:port (connection refused)` for every task whose port does not answer now."""
    lines = []
    for task in tasks:
        why = probe(task, timeout_s)
        if why is not None:
            lines.append(f"{task.name} at {task.address} ({why})")
    return lines

"""The workers meet before TensorFlow connects: every task present, and all training the same thing.

TensorFlow's own rendezvous (building MultiWorkerMirroredStrategy) blocks inside C++ holding Python's lock, so
nothing can report, time out or handle a signal while it waits. tfship therefore meets first, in Python, on
the chief's own cluster port (TensorFlow binds it only after this ends):

* the chief listens on its cluster address (that address only) and waits until every other task has said
  hello, printing every few seconds which tasks are missing, with their addresses;
* every other task connects to the chief (retrying while it is not up yet) and sends its rank and its
  fingerprints (`pipeline.training.agreement`: config, code, data, starting step);
* the chief compares them and answers everyone `go`, or the one line naming what differs (each task then
  stops with that line), and closes the port for TensorFlow.

Every wait is bounded by `timeout_s` (`train.cluster_timeout_s`), and runs in short slices so SIGINT/SIGTERM
(`StopRequest`) end it at once. Messages are single JSON lines of at most `MAX_MESSAGE` bytes.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

import numpy as np

from tfship.core.errors import StageError
from tfship.pipeline.training.agreement import disagreement
from tfship.pipeline.training.cluster import Cluster, Task, probe

MAX_MESSAGE = 4096
SLICE_S = 0.5
REPORT_EVERY_S = 5.0


class _Waiting:
    """Deadline, stop checks and the periodic "waiting for" line of one rendezvous."""

    def __init__(self, cluster: Cluster, timeout_s: float, stop, say: Callable[[str], None]):
        self.cluster, self.timeout_s, self.stop, self.say = cluster, timeout_s, stop, say
        self.started = self.reported = time.monotonic()

    def check(self, missing: list[Task], why: Callable[[Task], str | None] = probe) -> None:
        """Raise on a signal or past the deadline; report the missing tasks every `REPORT_EVERY_S`."""
        now = time.monotonic()
        if self.stop is not None and self.stop.requested:
            raise StageError(f"train: stopped by {self.stop.signal_name} while waiting for "
                             f"{self._names(missing, why)}; nothing trained, no checkpoint written")
        if now - self.started > self.timeout_s:
            raise StageError(f"train: gave up after {self.timeout_s:g} s (train.cluster_timeout_s) connecting to "
                             f"the cluster; waiting for: {self._names(missing, why)}")
        if now - self.reported >= REPORT_EVERY_S:
            self.reported = now
            self.say(f"{self.cluster.me.name}: waiting for {self._names(missing, why)} "
                     f"({now - self.started:.0f} s of {self.timeout_s:g} s)")

    @staticmethod
    def _names(missing: list[Task], why) -> str:
        parts = []
        for task in missing:
            reason = why(task)
            parts.append(f"{task.name} at {task.address}" + (f" ({reason})" if reason else ""))
        return "; ".join(parts)


def meet(cluster: Cluster, values: dict[str, int], timeout_s: float, stop=None,
         say: Callable[[str], None] = print) -> None:
    """Wait for the whole cluster and compare `values` (see the module docstring).

    Raises:
        StageError: a task missing after `timeout_s` (named with its address), a signal, the chief lost,
            or the workers' values differ (one line naming what, the same on every task).
    """
    waiting = _Waiting(cluster, timeout_s, stop, say)
    if cluster.size == 1:
        return
    if cluster.is_chief:
        _lead(cluster, values, waiting)
    else:
        _follow(cluster, values, waiting)


def _send(sock: socket.socket, message: dict) -> None:
    sock.sendall(json.dumps(message).encode()[:MAX_MESSAGE - 1] + b"\n")


def _receive(sock: socket.socket, deadline: float, waiting: _Waiting | None = None,
             missing: list[Task] | None = None) -> dict | None:
    """One JSON line, or None when the peer closed; raises StageError past `deadline` or on a signal."""
    data = b""
    while b"\n" not in data:
        if waiting is not None:
            waiting.check(missing or [], lambda _t: "connected; it waits for the other workers")
        if time.monotonic() > deadline:
            raise TimeoutError
        sock.settimeout(SLICE_S)
        try:
            chunk = sock.recv(MAX_MESSAGE)
        except TimeoutError:
            continue
        if not chunk:
            return None
        data += chunk
        if len(data) > MAX_MESSAGE:
            return None
    try:
        message = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _lead(cluster: Cluster, values: dict[str, int], waiting: _Waiting) -> None:
    me = cluster.me
    others = {cluster.rank_of(t): t for t in cluster.peers}
    hellos: dict[int, tuple[socket.socket, list[int]]] = {}
    infos = socket.getaddrinfo(me.host, me.port, type=socket.SOCK_STREAM)
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(sockaddr)
        server.listen(len(others) + 4)
        server.settimeout(SLICE_S)
        try:
            while len(hellos) < len(others):
                missing = [t for r, t in sorted(others.items()) if r not in hellos]
                waiting.check(missing, lambda _t: "not connected yet")
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                hello = _hello(conn, others, hellos, values)
                if hello is not None:
                    hellos[hello[0]] = (conn, hello[1])
            rows = np.array([[*values.values()]] + [hellos[r][1] for r in sorted(hellos)], dtype=np.int64)
            names = [me.name] + [others[r].name for r in sorted(hellos)]
            message = disagreement(list(values), rows, names)
            for conn, _ in hellos.values():
                try:
                    _send(conn, {"refuse": message} if message else {"go": True})
                except OSError:
                    pass
            if message:
                raise StageError(message)
            deadline = time.monotonic() + 5.0
            for conn, _ in hellos.values():  # let the others close first (their side keeps TIME_WAIT)
                try:
                    _receive(conn, deadline)
                except (TimeoutError, OSError):
                    pass
        finally:
            for conn, _ in hellos.values():
                conn.close()


def _hello(conn: socket.socket, others: dict[int, Task], hellos: dict,
           values: dict[str, int]) -> tuple[int, list[int]] | None:
    """(rank, values) of a valid hello; anything else is answered, closed and ignored."""
    try:
        message = _receive(conn, time.monotonic() + 5.0)
    except (TimeoutError, OSError):
        message = None
    rank = message.get("rank") if message else None
    got = message.get("values") if message else None
    if not isinstance(rank, int) or rank not in others or not isinstance(got, list) or len(got) != len(values):
        problem = "not a tfship worker of this cluster (or another tfship version)"
    elif rank in hellos:
        problem = f"{others[rank].name} is already connected (two workers with the same index?)"
    else:
        return rank, [int(v) for v in got]
    try:
        _send(conn, {"refuse": f"train: the chief refused this worker: {problem}"})
    except OSError:
        pass
    conn.close()
    return None


def _follow(cluster: Cluster, values: dict[str, int], waiting: _Waiting) -> None:
    chief = cluster.chief
    while True:
        waiting.check([chief])
        try:
            conn = socket.create_connection((chief.host, chief.port), timeout=SLICE_S * 2)
        except OSError:
            time.sleep(SLICE_S)
            continue
        with conn:
            try:
                _send(conn, {"rank": cluster.rank, "values": list(values.values())})
                reply = _receive(conn, waiting.started + waiting.timeout_s + 10.0, waiting, [chief])
            except (TimeoutError, OSError):
                reply = None
            if reply is None:
                time.sleep(SLICE_S)  # the chief went away or restarted: try again until the deadline
                continue
            if "refuse" in reply:
                raise StageError(str(reply["refuse"])[:2000])
            if reply.get("go") is True:
                return

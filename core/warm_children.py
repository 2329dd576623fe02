"""Warm converter children: TensorFlow imported once per converter family and stage, not once per artifact.

A converter child (`python -m tfship.tflite.worker convert ...`) spends most of its life importing TensorFlow
(4-11 s on 2 busy cores, against about 1 s of converting a small model). While a `warm_children()` block is
open, `run_warm_or_cold(command, ...)` hands such a command to a long-lived child of the same worker module
(`core.warm_server`), which runs `module.main(argv)` for one job after another. Outside such a block, or for a
command that is not `[sys.executable, "-m", module, ...]`, it is `core.processes.run_converter_child` (a fresh
process per command), with the same `ChildOutcome`.

Isolation is kept per job, as with a fresh process:
- a job that kills its child (segfault, abort, SIGKILL) is reported as `run_converter_child` reports it
  ("... died with SIGABRT (signal 6); output tail: ..."); the child is gone, and the next job starts a fresh
  one (the restart);
- a job past its time limit gets its child's whole process group killed with SIGKILL and is reported
  "timed out after N s ..."; the next job starts a fresh child;
- a job that exits non-zero or writes no report is reported with its output tail, and its child is retired
  (its state is not trusted for the next job);
- only a job that ended with status 0 and its report hands its child back for the next one.

A child serves one job at a time; a job that finds every child of its kind busy starts another (the caller's
scheduler decides how many run at once: `pipeline.conversion.memory_budget`). Children are keyed by worker
module, environment and working folder, so a job never runs in a child started with another environment.
Each child runs in its own session, gets SIGKILL when this process dies (`die_with_parent_command`; started
from one thread that lives as long as the block, as the kernel's rule asks), and is killed and reaped when the
block closes: none outlives the stage. Its output goes to a file; each job's part is its output tail.
`peak_rss_bytes` is the child's high-water mark during the job (`core.warm_server`), which includes what the
child already held: TensorFlow and earlier jobs' leftovers.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from tfship.core.processes import OUTPUT_TAIL_CHARS, ChildOutcome, die_with_parent_command, run_converter_child

SERVER_MODULE = "tfship.core.warm_server"


@dataclass(eq=False)
class WarmChild:
    """One warm child: its process (own session), the job pipe (write end), the reply pipe (read end) and its
    output file.
    """

    key: tuple
    process: subprocess.Popen
    jobs: IO[bytes]
    replies: int
    output: IO[bytes]
    buffer: bytearray = field(default_factory=bytearray)

    def kill(self) -> int:
        """SIGKILL its process group (before reaping it, so the group id cannot have been reused), reap it and
        close its pipes; returns its lifetime peak RSS from the kernel (0 when already reaped).
        """
        peak = 0
        if self.process.returncode is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            peak = _reap(self.process)
        for close in (self.jobs.close, lambda: os.close(self.replies), self.output.close):
            try:
                close()
            except OSError:
                pass
        return peak

    def output_since(self, offset: int) -> str:
        """What the child printed from byte `offset` on."""
        self.output.seek(offset)
        return self.output.read().decode(errors="replace")


def _reap(process: subprocess.Popen) -> int:
    """Wait for `process` (already killed or exiting); set its returncode; its peak RSS (ru_maxrss) in bytes."""
    if process.returncode is not None:
        return 0
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return int(usage.ru_maxrss) * 1024


def _module_job(command: Sequence[str]) -> tuple[str, list[str]] | None:
    """(module, argv) of `[sys.executable, "-m", module, *argv]`; None for any other command."""
    if len(command) >= 3 and command[0] == sys.executable and command[1] == "-m":
        return command[2], list(command[3:])
    return None


class WarmChildren:
    """The warm children of one or more `warm_children()` blocks (see the module docstring)."""

    def __init__(self) -> None:
        self._idle: dict[tuple, list[WarmChild]] = {}
        self._busy: set[WarmChild] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warm-children")
        self.started = 0  # children started, restarts included (for tests and the report)

    def run(self, module: str, argv: list[str], who: str, timeout_s: float, report: Path | None,
            env: Mapping[str, str] | None, cwd: Path | None) -> ChildOutcome:
        """Run one job (`module.main(argv)`) in a warm child within `timeout_s` (child start included when a
        fresh child is needed); the outcome reads as `run_converter_child`'s for the same command.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        key = (module, tuple(sorted((env or os.environ).items())), str(cwd or os.getcwd()))
        child = self._take(key, env, cwd)
        offset = os.fstat(child.output.fileno()).st_size
        try:
            child.jobs.write((json.dumps({"argv": argv}) + "\n").encode())
            child.jobs.flush()
            reply = self._reply(child, deadline)
        except BrokenPipeError:
            reply = None
        keep = False
        try:
            output = child.output_since(offset)
            tail = " ".join(output.split())[-OUTPUT_TAIL_CHARS:]
            if reply == "timeout":
                return ChildOutcome(None, output, f"timed out after {timeout_s:g} s in the {who} (worker killed "
                                                  "with SIGKILL)", child.kill())
            if reply is None:  # the child died: its status tells how
                peak = child.kill()
                code = child.process.returncode
                if code < 0:
                    sig = signal.Signals(-code)
                    return ChildOutcome(code, output, f"{who} died with {sig.name} (signal {sig.value}); "
                                                      f"output tail: {tail}", peak)
                return ChildOutcome(code, output, f"{who} exited with status {code} and no report; "
                                                  f"output tail: {tail}", peak)
            code, peak = int(reply["rc"]), int(reply["peak_rss_bytes"])
            if code != 0 or (report is not None and not report.is_file()):
                missing = " and no report" if report is not None and not report.is_file() else ""
                return ChildOutcome(code, output, f"{who} exited with status {code}{missing}; "
                                                  f"output tail: {tail}", peak)
            keep = True
            return ChildOutcome(0, output, "", peak)
        finally:
            self._give_back(child, keep)

    def _reply(self, child: WarmChild, deadline: float) -> dict[str, Any] | Literal["timeout"] | None:
        """The job's reply; "timeout" past `deadline`; None when the child closed the pipe (it died)."""
        while b"\n" not in child.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            ready, _, _ = select.select([child.replies], [], [], min(remaining, 1.0))
            if ready:
                chunk = os.read(child.replies, 4096)
                if not chunk:
                    return None
                child.buffer += chunk
        line, _, rest = bytes(child.buffer).partition(b"\n")
        child.buffer[:] = rest
        return json.loads(line)

    def _take(self, key: tuple, env: Mapping[str, str] | None, cwd: Path | None) -> WarmChild:
        with self._lock:
            idle = self._idle.get(key, [])
            child = idle.pop() if idle else None
            if child is not None:
                self._busy.add(child)
                return child
        child = self._spawner.submit(self._spawn, key, env, cwd).result()
        with self._lock:
            self._busy.add(child)
            self.started += 1
        return child

    def _spawn(self, key: tuple, env: Mapping[str, str] | None, cwd: Path | None) -> WarmChild:
        """Start a child (on the spawner thread, which lives until `close`: the parent-death signal's rule)."""
        job_read, job_write = os.pipe()
        reply_read, reply_write = os.pipe()
        output = tempfile.TemporaryFile()
        try:
            command = die_with_parent_command([sys.executable, "-m", SERVER_MODULE, key[0], str(job_read),
                                               str(reply_write)])
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                       env=None if env is None else dict(env), cwd=cwd, start_new_session=True,
                                       pass_fds=(job_read, reply_write))
        except BaseException:
            for fd in (job_write, reply_read):
                os.close(fd)
            output.close()
            raise
        finally:
            os.close(job_read)
            os.close(reply_write)
        return WarmChild(key, process, os.fdopen(job_write, "wb"), reply_read, output)

    def _give_back(self, child: WarmChild, keep: bool) -> None:
        with self._lock:
            self._busy.discard(child)
            if keep and not self._closed:
                self._idle.setdefault(child.key, []).append(child)
                return
        if not child.output.closed:
            child.kill()

    def idle_rss_bytes(self) -> int:
        """Resident bytes held by the idle children (what a memory budget must count beside running jobs)."""
        with self._lock:
            pids = [c.process.pid for children in self._idle.values() for c in children]
        return sum(_rss_bytes(pid) for pid in pids)

    def pids(self) -> list[int]:
        """Process ids of the living children, idle and busy."""
        with self._lock:
            children = [*self._busy, *(c for cs in self._idle.values() for c in cs)]
        return [c.process.pid for c in children if c.process.returncode is None]

    def close(self) -> None:
        """Kill and reap the idle children; a busy one is killed when its job returns. Then stop the spawner."""
        with self._lock:
            self._closed = True
            idle = [c for children in self._idle.values() for c in children]
            self._idle.clear()
        for child in idle:
            child.kill()
        self._spawner.shutdown(wait=True)


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


_ACTIVE: WarmChildren | None = None
_USERS = 0
_ACTIVE_LOCK = threading.Lock()


@contextmanager
def warm_children() -> Iterator[WarmChildren]:
    """Open a block in which `run_warm_or_cold` uses warm children; blocks open at once share one set, closed
    (every child killed and reaped) when the last one ends.
    """
    global _ACTIVE, _USERS
    with _ACTIVE_LOCK:
        if _ACTIVE is None:
            _ACTIVE = WarmChildren()
        _USERS += 1
        pool = _ACTIVE
    try:
        yield pool
    finally:
        with _ACTIVE_LOCK:
            _USERS -= 1
            last = _USERS == 0
            if last:
                _ACTIVE = None
        if last:
            pool.close()


def run_warm_or_cold(command: Sequence[str], who: str, timeout_s: float, *, report: Path | None = None,
                     env: Mapping[str, str] | None = None, cwd: Path | None = None) -> ChildOutcome:
    """`run_converter_child(command, ...)`, in a warm child when a `warm_children()` block is open and
    `command` is `[sys.executable, "-m", module, *argv]` with `module.main(argv)` as its entry point.
    """
    pool, job = _ACTIVE, _module_job(command)
    if pool is None or job is None:
        return run_converter_child(command, who, timeout_s, report=report, env=env, cwd=cwd)
    return pool.run(job[0], job[1], who, timeout_s, report, env, cwd)


__all__ = ["WarmChild", "WarmChildren", "run_warm_or_cold", "warm_children"]

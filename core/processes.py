"""Child processes that never outlive their parent (no orphans after a `kill -9`).

Linux's `prctl(PR_SET_PDEATHSIG, sig)` asks the kernel to send `sig` to a child the moment its parent dies,
however it died, and the setting survives `execve`. `die_with_parent_command(command, sig)` returns the argv
that runs `command` behind a few-line guard: a bare interpreter (`python -S`) sets the signal, checks the parent
is still the one that started it (covering the race where the parent died first) and `exec`s `command` in the
same process. Elsewhere (macOS) the command is returned unchanged.

Why not a `preexec_fn`: a `preexec_fn` makes CPython `fork()` instead of `vfork()`, and in a process where gRPC
is running, gRPC's fork handlers restart its poller thread in the child, which then finds its epoll file
descriptor closed by `close_fds` and aborts (SIGABRT, "epoll_wait error: Bad file descriptor") before `exec`
(grpc/grpc#43055). Without a `preexec_fn` CPython uses `vfork()`, which runs no fork handlers.

`run_converter_child(...)` is the one runner of the converter children (TFLite, ONNX, TF.js): their own process
group, killed whole at the time limit, with the exit status, the signal and the output's tail told in one
`ChildOutcome`.

Used by the serve-check and test servers (`serving.launcher`, SIGKILL), the `--num-processes` workers
(`serving.workers`, SIGTERM: they drain within the grace period), the multi-worker training launcher (SIGTERM)
and the converter children (`tflite`, ONNX, TF.js, SIGKILL). Note the kernel's rule: the signal follows the
death of the parent *thread* that started the child, so start long-lived children from a thread that lives as
long as they should.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tfship.core.child_memory import run_measured

PR_SET_PDEATHSIG = 1

# Runs in the child under `python -S -c`: stdlib only, no site-packages, so it starts in about 15 ms.
_GUARD = (
    "import ctypes, os, sys\n"
    "parent, sig = int(sys.argv[1]), int(sys.argv[2])\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, sig, 0, 0, 0)\n"
    "if os.getppid() != parent: os.kill(os.getpid(), sig)\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n"
)


def _prctl():
    """Libc's `prctl` on Linux; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (one of another user counts as alive: it is not ours to clean up after)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_running(pid: int) -> bool:
    """Whether process `pid` exists and has not exited: `pid_alive` minus zombies (an exited child its parent has
    not reaped yet, state `Z` in Linux's `/proc/<pid>/stat`; elsewhere the same as `pid_alive`).
    """
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][:1] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True


def die_with_parent_command(command: Sequence[str], sig: int = signal.SIGKILL) -> list[str]:
    """The argv running `command` so that it receives `sig` when this process dies (Linux; unchanged elsewhere).

    The returned process *is* `command` after its first ~15 ms (same pid: the guard `exec`s it), so `Popen`'s
    pid, signals, pipes and return code all belong to `command`. Raises nothing itself; an unknown program
    makes the child exit 1 with Python's `FileNotFoundError` on stderr.

    Example: `subprocess.Popen(die_with_parent_command([sys.executable, "-m", "tfship.serving"], signal.SIGTERM))`.
    """
    if _PRCTL is None:
        return list(command)
    return [sys.executable, "-S", "-c", _GUARD, str(os.getpid()), str(int(sig)), *command]


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """In a running child (e.g. a process pool's worker initializer): receive `sig` when the parent dies."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


OUTPUT_TAIL_CHARS = 800  # of a failed child's output quoted in its failure


@dataclass(frozen=True)
class ChildOutcome:
    """How a converter child ended: `failure` is '' when it exited 0 (and wrote its report when one was named),
    else one sentence (timed out, died with a signal, or exited non-zero / without a report, with the tail
    of its output). `output` is all it printed (stdout and stderr together).
    """

    returncode: int | None
    output: str
    failure: str
    peak_rss_bytes: int = 0  # the child's peak resident memory (`core.child_memory.run_measured`)


def run_converter_child(command: Sequence[str], who: str, timeout_s: float, *, report: Path | None = None,
                        env: Mapping[str, str] | None = None, cwd: Path | None = None) -> ChildOutcome:
    """Run a converter `command` in its own process group until it exits or `timeout_s` passes.

    Args:
        who: how the failure names the child, e.g. `convert worker`, `TF.js converter`, `tf2onnx`.
        report: a file the child must have written when it exits 0 (None: no report expected).
        env, cwd: the child's environment and working directory (None: this process's).

    Returns a `ChildOutcome` with the child's peak resident memory (the kernel's figure); raises nothing for the
    child's own failures. The child gets SIGKILL when this process dies (`die_with_parent_command`), and its
    whole group gets SIGKILL at the time limit.
    """
    done = run_measured(die_with_parent_command(list(command)), max(0.0, timeout_s), env=env, cwd=cwd,
                        new_session=True)
    output, peak = done.output.decode(errors="replace"), done.peak_rss_bytes
    if done.timed_out:
        return ChildOutcome(None, output, f"timed out after {timeout_s:g} s in the {who} (worker killed with "
                                          "SIGKILL)", peak)
    tail = " ".join(output.split())[-OUTPUT_TAIL_CHARS:]
    if done.returncode < 0:
        sig = signal.Signals(-done.returncode)
        return ChildOutcome(done.returncode, output,
                            f"{who} died with {sig.name} (signal {sig.value}); output tail: {tail}", peak)
    if done.returncode != 0 or (report is not None and not report.is_file()):
        missing = " and no report" if report is not None and not report.is_file() else ""
        return ChildOutcome(done.returncode, output,
                            f"{who} exited with status {done.returncode}{missing}; output tail: {tail}", peak)
    return ChildOutcome(0, output, "", peak)

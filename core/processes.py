"""Child processes that never outlive their parent (no orphans after a `kill -9`).

Linux's `prctl(PR_SET_PDEATHSIG, sig)` asks the kernel to send `sig` to a child the moment its parent dies,
however it died. `die_with_parent(sig)` returns a `preexec_fn` for `subprocess.Popen` that sets it (and
covers the race where the parent died before the child got there). Elsewhere (macOS) it is a no-op.

Used by the serve-check and test servers (`serving.launcher`, SIGKILL), the `--num-processes` workers
(`serving.workers`, SIGTERM: they drain within the grace period) and the converter children (`tflite`,
ONNX, SIGKILL). Note the kernel's rule: the signal follows the death of the parent *thread* that started
the child, so start long-lived children from a thread that lives as long as they should.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def _prctl():
    """Libc's `prctl`, resolved in the parent (a child between fork and exec must not load libraries)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A `preexec_fn` making the child receive `sig` when this process dies; None where unsupported.

    Example: `subprocess.Popen(cmd, preexec_fn=die_with_parent(signal.SIGTERM))`.
    """
    if _PRCTL is None:
        return None
    parent = os.getpid()
    prctl = _PRCTL

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl: act as the kernel would have
            os.kill(os.getpid(), sig)

    return preexec


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """In a running child (e.g. a process pool's worker initializer): receive `sig` when the parent dies."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)

"""`die_with_parent`: a child started with it does not outlive a parent killed with SIGKILL (no orphans)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from core.processes import die_with_parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for init to reap it counts as gone
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"


@pytest.mark.parametrize(("guarded", "survives"), [(True, False), (False, True)])
def test_child_dies_with_a_killed_parent(guarded, survives):
    parent_code = textwrap.dedent(f"""
        import subprocess, sys, time
        from core.processes import die_with_parent
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 preexec_fn=die_with_parent() if {guarded} else None, start_new_session=True)
        print(child.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    child = int(parent.stdout.readline())
    try:
        parent.kill()  # kill -9: no handler runs in the parent
        parent.wait()
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(child) is survives  # the unguarded control proves the test can tell
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_preexec_is_none_or_callable():
    hook = die_with_parent(signal.SIGTERM)
    assert hook is None or callable(hook)

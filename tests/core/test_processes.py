"""`die_with_parent_command`: a child started through it does not outlive a parent killed with SIGKILL (no orphans),
and starting it never forks the parent (no gRPC fork handlers: a server started from a gRPC client process lives)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tfship.core.processes import die_with_parent_command

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
        from tfship.core.processes import die_with_parent_command
        command = [sys.executable, "-c", "import time; time.sleep(60)"]
        child = subprocess.Popen(die_with_parent_command(command) if {guarded} else command, start_new_session=True)
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


def test_guarded_command_is_the_command_itself():
    """Same pid, exit code, output and arguments as the command run directly."""
    command = [sys.executable, "-c", "import os, sys; print(os.getpid(), sys.argv[1:]); sys.exit(3)", "a b", "-c"]
    child = subprocess.Popen(die_with_parent_command(command, signal.SIGTERM), stdout=subprocess.PIPE, text=True)
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 3
    assert out.split(" ", 1) == [str(child.pid), "['a b', '-c']\n"]


def test_grpc_client_process_starts_children_without_forking():
    """A process with live gRPC channels starts many guarded children; none aborts between fork and exec."""
    code = textwrap.dedent("""
        import subprocess, sys, grpc
        from tfship.core.processes import die_with_parent_command
        channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for port in (1, 2, 3)]
        for channel in channels:
            channel.subscribe(lambda state: None, try_to_connect=True)
        codes = [subprocess.run(die_with_parent_command([sys.executable, "-S", "-c", "pass"])).returncode
                 for _ in range(30)]
        print(codes.count(0))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["30"]

"""Simulated hosts for the multi-worker training tests: Linux network namespaces joined by veth pairs.

`Hosts(count)` creates `count` namespaces, each with loopback and one veth end holding the address
`10.251.24.<i+1>/24`; the other ends are joined by a bridge in a further namespace (the "switch"), so
every address exists only inside the namespaces the test made, and no traffic reaches the machine's
own interfaces. `start(i, argv, env)` runs a process inside host i (`ip netns exec`), its output in a
log file; `cut(i)` takes host i's link down (a cut cable). `names` maps host names to host indices
in each namespace's own /etc/hosts (as a cluster DNS would), e.g. the pod names of an Indexed Job. Leaving the context stops every process it
started by PID (SIGTERM, then SIGKILL after a bounded wait) and deletes the namespaces.

Needs root and `ip` (iproute2); `namespaces_available()` says why not where they cannot be made.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

SUBNET = "10.251.24"
STOP_WAIT_S = 10.0


def _ip(*args: str, netns: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, timeout=20)


def namespaces_available() -> str | None:
    """None when network namespaces can be made here, else the reason they cannot."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    name = f"tfship-probe-{os.getpid()}"
    try:
        _ip("netns", "add", name)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        return f"`ip netns add` failed: {getattr(err, 'stderr', b'') or err}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
    return None


class Hosts:
    """`count` network namespaces on one bridge; see the module docstring."""

    def __init__(self, count: int, logs: Path, names: dict[str, int] | None = None):
        self.count, self.logs, self.host_names = count, logs, names or {}
        tag = f"{os.getpid() % 100000}"
        self.names = [f"tfship-{tag}-h{i}" for i in range(count)]
        self.switch = f"tfship-{tag}-sw"
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(count)]
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> Hosts:
        try:
            _ip("netns", "add", self.switch)
            _ip("link", "add", "br0", "type", "bridge", netns=self.switch)
            _ip("link", "set", "br0", "up", netns=self.switch)
            for i, name in enumerate(self.names):
                _ip("netns", "add", name)
                _ip("link", "set", "lo", "up", netns=name)
                _ip("link", "add", "eth0", "type", "veth", "peer", "name", f"port{i}", netns=name)
                _ip("link", "set", f"port{i}", "netns", self.switch, netns=name)
                _ip("link", "set", f"port{i}", "master", "br0", netns=self.switch)
                _ip("link", "set", f"port{i}", "up", netns=self.switch)
                _ip("addr", "add", f"{self.addresses[i]}/24", "dev", "eth0", netns=name)
                _ip("link", "set", "eth0", "up", netns=name)
                if self.host_names:  # `ip netns exec` mounts /etc/netns/<name>/hosts over /etc/hosts
                    folder = Path("/etc/netns") / name
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
                        f"{self.addresses[h]} {n}\n" for n, h in self.host_names.items()))
        except BaseException:
            self._remove()
            raise
        return self

    def start(self, host: int, argv: list[str], env: dict[str, str], log_name: str,
              cwd: Path | None = None) -> subprocess.Popen:
        """Start `argv` inside host `host` (its own PID; `ip netns exec` execs it), output into `logs/log_name`."""
        log = (self.logs / log_name).open("wb")
        try:
            proc = subprocess.Popen(["ip", "netns", "exec", self.names[host], *argv], env=env, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd)
        finally:
            log.close()
        self.processes.append(proc)
        return proc

    def log(self, log_name: str) -> str:
        return (self.logs / log_name).read_text(errors="replace")

    def cut(self, host: int) -> None:
        """Take host `host`'s link down, as if its cable were pulled (its processes keep running)."""
        _ip("link", "set", f"port{host}", "down", netns=self.switch)

    def stop_all(self) -> None:
        """SIGTERM every process still running, SIGKILL any left after `STOP_WAIT_S`."""
        for proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        for proc in self.processes:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_WAIT_S)

    def _remove(self) -> None:
        for name in [*self.names, self.switch]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)

    def __exit__(self, *exc) -> None:
        try:
            self.stop_all()
        finally:
            self._remove()


def wait_all(processes: list[subprocess.Popen], timeout_s: float) -> list[int]:
    """Wait for every process, at most `timeout_s` in all; returns their exit codes (AssertionError on timeout)."""
    deadline = time.monotonic() + timeout_s
    for proc in processes:
        remaining = deadline - time.monotonic()
        try:
            proc.wait(timeout=max(0.1, remaining))
        except subprocess.TimeoutExpired as err:
            raise AssertionError(f"process {proc.pid} ({' '.join(proc.args[-6:])}) still running after "
                                 f"{timeout_s} s") from err
    return [p.returncode for p in processes]

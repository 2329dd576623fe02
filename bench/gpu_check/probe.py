"""What the machine offers, read without TensorFlow in this process: GPUs (nvidia-smi), cores, ONNX Runtime's
providers, and whether Docker can hand a GPU to a container.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    """One NVIDIA GPU as nvidia-smi reports it (memory in MiB)."""

    index: int
    name: str
    memory_total_mib: int
    driver: str


def _run(cmd: list[str], timeout_s: float = 20.0) -> str | None:
    """stdout of `cmd`, or None when it is missing, fails or hangs."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def gpus() -> list[Gpu]:
    """The GPUs nvidia-smi lists (none where nvidia-smi is missing or fails)."""
    out = _run(["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader,nounits"])
    found = []
    for line in (out or "").strip().splitlines():
        index, name, memory, driver = (part.strip() for part in line.split(","))
        found.append(Gpu(int(index), name, int(float(memory)), driver))
    return found


def gpu_memory_used_mib(pid: int) -> int | None:
    """GPU memory (MiB) held by process `pid` and its children per nvidia-smi, None without nvidia-smi."""
    out = _run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    if out is None:
        return None
    family = {pid} | _descendants(pid)
    used = 0
    for line in out.strip().splitlines():
        owner, memory = (part.strip() for part in line.split(","))
        if owner.isdigit() and int(owner) in family:
            used += int(float(memory))
    return used


def _descendants(pid: int) -> set[int]:
    children: set[int] = set()
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                for child in handle.read().split():
                    children |= {int(child)} | _descendants(int(child))
    except OSError:
        pass
    return children


def onnx_providers() -> list[str]:
    """ONNX Runtime's available execution providers in this environment."""
    import onnxruntime as ort

    return list(ort.get_available_providers())


def docker_gpu_runtime() -> str | None:
    """Why Docker cannot run `--gpus all` here, or None when it can (an `nvidia` runtime is registered)."""
    if shutil.which("docker") is None:
        return "no docker command"
    out = _run(["docker", "info", "--format", "{{json .Runtimes}}"])
    if out is None:
        return "no Docker engine answers (docker info failed)"
    try:
        runtimes = json.loads(out)
    except json.JSONDecodeError:
        return "docker info gave no runtime list"
    return None if "nvidia" in runtimes else f"the Docker engine has no nvidia runtime (runtimes: {sorted(runtimes)})"


def machine() -> dict:
    """The machine in words and numbers, for the report's header."""
    found = gpus()
    return {"host": platform.node(), "cpu_cores": len(os.sched_getaffinity(0)),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "gpus": "; ".join(f"{g.name} ({g.memory_total_mib} MiB, driver {g.driver})" for g in found) or "none",
            "onnxruntime_providers": ", ".join(onnx_providers())}

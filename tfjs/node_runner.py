"""Run a TF.js graph model in Node.js (`tfjs/node/run_graph_model.mjs`, CPU backend) from Python.

One long-lived `node` child per model speaks JSON lines over its stdin/stdout (protocol in the script):
each call sends {input name: array} and gets {output name: array} back, keyed by the SavedModel
signature's output names (never by position). TF.js has no 64-bit integers: int64 inputs are sent as
int32 (refused when a value does not fit) and outputs come back as the dtype the model's signature
declares (DT_INT64 -> int64). The child is killed when the runner is closed or garbage-collected, when a
call exceeds its time limit, or when this process dies (`core.processes.die_with_parent_command`; it also exits at
the end of its input).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tfship.core.errors import ConversionError
from tfship.core.processes import die_with_parent_command
from tfship.tfjs.venv import NODE_DIR, ensure_node_modules, node_executable

SCRIPT = NODE_DIR / "run_graph_model.mjs"
_TO_NUMPY = {"DT_FLOAT": np.float32, "DT_INT32": np.int32, "DT_INT64": np.int64, "DT_BOOL": np.bool_}
_WIRE = {"f": "float32", "i": "int32", "u": "int32", "b": "bool"}


def _encode(value: np.ndarray) -> dict[str, Any]:
    value = np.asarray(value)
    if value.dtype.kind not in _WIRE or value.dtype.itemsize > 8:
        raise ConversionError(f"TF.js runner: inputs of dtype {value.dtype} are not supported")
    wire = _WIRE[value.dtype.kind]
    if wire == "int32" and value.size and (value.min() < -2**31 or value.max() >= 2**31):
        raise ConversionError("TF.js runner: integer input does not fit int32 (TF.js has no int64)")
    array = np.ascontiguousarray(value.astype("<f4" if wire == "float32" else "<i4" if wire == "int32" else "u1"))
    return {"dtype": wire, "shape": list(value.shape), "data": base64.b64encode(array.tobytes()).decode()}


def _decode(payload: dict[str, Any], declared: str | None) -> np.ndarray:
    raw = base64.b64decode(payload["data"])
    wire = {"float32": "<f4", "int32": "<i4", "bool": "u1"}[payload["dtype"]]
    value = np.frombuffer(raw, dtype=wire).reshape(payload["shape"])
    return value.astype(_TO_NUMPY.get(declared or "", value.dtype))


class NodeGraphModelRunner:
    """Callable {input name: [N, ...] array} -> {output name: array} backed by one `node` child.

    Args:
        model_dir: folder with `model.json` and its weight shards.
        timeout_s: seconds allowed for loading the model and for each call.

    Attributes:
        inputs / outputs: {name: {"node", "dtype", "shape"}} read from model.json's signature.
        versions: tfjs-core / tfjs-converter / node versions the child reports.

    Raises:
        ConversionError: Node.js or its packages missing, the model does not load, a call fails or
            times out (the message carries the child's error).
    """

    def __init__(self, model_dir: Path, timeout_s: float = 120.0):
        ensure_node_modules()
        self.timeout_s = timeout_s
        self._next_id = 0
        command = [node_executable(), str(SCRIPT), str(Path(model_dir).resolve())]
        self._proc = subprocess.Popen(die_with_parent_command(command), cwd=NODE_DIR, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        assert self._proc.stdin and self._proc.stdout and self._proc.stderr  # all three are pipes (PIPE above)
        self._stdin, self._stdout, self._stderr_pipe = self._proc.stdin, self._proc.stdout, self._proc.stderr
        self._stderr: list[str] = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        ready = self._read_line("loading the model")
        self.inputs, self.outputs, self.versions = ready["inputs"], ready["outputs"], ready.get("versions", {})

    def _drain_stderr(self) -> None:
        for line in self._stderr_pipe:
            self._stderr.append(line.rstrip())
            del self._stderr[:-40]

    def _read_line(self, what: str) -> dict[str, Any]:
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self._stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.timeout_s)
        if reader.is_alive():
            self.close()
            raise ConversionError(f"TF.js runner: {what} took longer than {self.timeout_s:g} s (node killed)")
        if not result or not result[0]:
            self._proc.wait(timeout=5)
            tail = " ".join(" ".join(self._stderr).split())[-1200:]
            raise ConversionError(f"TF.js runner: node exited with status {self._proc.returncode} while {what}: "
                                  f"{tail}")
        return json.loads(result[0])

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._next_id += 1
        request = {"id": self._next_id, "inputs": {name: _encode(value) for name, value in inputs.items()}}
        try:
            self._stdin.write(json.dumps(request) + "\n")
            self._stdin.flush()
        except (BrokenPipeError, ValueError) as err:
            raise ConversionError(f"TF.js runner: node is not running ({err})") from err
        reply = self._read_line("running a batch")
        if reply.get("error"):
            raise ConversionError(f"TF.js runner: {reply['error']}")
        return {name: _decode(payload, self.outputs.get(name, {}).get("dtype"))
                for name, payload in reply["outputs"].items()}

    def close(self) -> None:
        """Stop the node child (SIGKILL to its process group if it does not exit on end of input)."""
        if self._proc.poll() is None:
            try:
                self._stdin.close()
                self._proc.wait(timeout=5)
            except (subprocess.TimeoutExpired, BrokenPipeError, OSError):
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()

    def __enter__(self) -> NodeGraphModelRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

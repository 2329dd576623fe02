"""Convert a SavedModel's `serving_default` to a TF.js graph model and prove it runs in Node.js.

Steps (TF.js converter 4.22.0, `tensorflowjs.converters.convert_tf_saved_model`):
1. `python -m tfship.tfjs.worker` in `.venv-tfjs` (child process, own session, killed with SIGKILL past the
   time limit) writes `model.json` + weight shards into a hidden temporary folder beside `output_dir`
   and names every output in `model.json`'s signature (see `tfjs.worker`).
2. Node.js (`tfjs.node_runner`, CPU backend) loads the folder and runs one real input batch: the output
   names must equal the SavedModel's, float outputs must be finite, and the batch dimension must follow
   the input (dynamic batch).
3. Only then is the folder moved into place (`os.replace`); on any other status `output_dir` does not
   exist afterwards. `<output_dir>.reproduce.sh` (kept in every case) repeats step 1.

Statuses follow `tflite.convert`: `produced`, `refused` (the converter or the Node check declined, with
the reason) or `crashed` (the child died, exited without a report, or ran past the limit).
"""

from __future__ import annotations

import enum
import json
import os
import shlex
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfship.core.errors import ConversionError, TfshipError
from tfship.core.processes import run_converter_child
from tfship.core.statuses import ConversionStatus
from tfship.tfjs.venv import ROOT, ensure_tfjs_venv

# Run by file path: the converter's own venv (.venv-tfjs) has TensorFlow.js but not tfship installed.
WORKER = Path(__file__).resolve().with_name("worker.py")



class TfjsQuantization(enum.StrEnum):
    """Weight storage of the TF.js graph model: float32 (as trained), or every weight quantized by the
    converter to float16 / uint8 (`quantization_dtype_map`, like `--quantize_float16` / `--quantize_uint8`).
    """

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    UINT8 = "uint8"

    @property
    def parity_mode(self) -> str:
        """The parity gate's mode: float32 / float16 tolerances, or the task metric for uint8 weights."""
        return {"float32": "float32", "float16": "float16", "uint8": "dynamic_range"}[self.value]

    @property
    def folder(self) -> str:
        """The artifact's folder in the version: `tfjs`, `tfjs_float16`, `tfjs_uint8`."""
        return "tfjs" if self is TfjsQuantization.FLOAT32 else f"tfjs_{self.value}"


@dataclass(frozen=True)
class TfjsConversionResult:
    """The outcome of the TF.js conversion.

    Attributes:
        status: `produced`, `refused` or `crashed`.
        reason: why it was refused or crashed; empty when produced.
        path: the `tfjs/` folder (model.json + shards) when produced, else None.
        size_bytes: bytes of model.json plus every shard; 0 when not produced.
        seconds: wall-clock seconds of conversion and Node check together.
        outputs: {signature output name: graph node such as `Identity_1:0`}.
        versions: tensorflowjs / tensorflow (converter) and tfjs-core / node (runner) versions.
        reproduce_command: shell line that repeats the conversion.
    """

    status: ConversionStatus
    reason: str
    path: Path | None
    size_bytes: int
    seconds: float
    outputs: dict[str, str]
    versions: dict[str, str]
    reproduce_command: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready values."""
        return {**self.__dict__, "path": None if self.path is None else str(self.path),
                "seconds": round(self.seconds, 3)}


def folder_size(folder: Path) -> int:
    """Bytes of every file in `folder` (model.json and its weight shards)."""
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def _run_worker(command: list[str], report: Path, timeout_s: float) -> tuple[dict[str, Any] | None, str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    env.pop("PYTHONPATH", None)  # .venv-tfjs puts the repository on its path itself (tfship-c-repo.pth)
    done = run_converter_child(command, "TF.js converter", timeout_s, report=report, env=env, cwd=ROOT)
    return (None, done.failure) if done.failure else (json.loads(report.read_text()), "")


def _node_check(folder: Path, sample: dict[str, np.ndarray], expected: tuple[str, ...], timeout_s: float
                ) -> tuple[str, dict[str, str]]:
    """'' when the model runs in Node with the expected names, finite floats and the input's batch; else why."""
    from tfship.tfjs.node_runner import NodeGraphModelRunner

    batch = len(next(iter(sample.values())))
    try:
        with NodeGraphModelRunner(folder, timeout_s=max(10.0, timeout_s)) as runner:
            outputs, versions = runner(sample), dict(runner.versions)
    except TfshipError as err:
        return f"Node.js check: {err}", {}
    if sorted(outputs) != sorted(expected):
        return f"Node.js check: outputs {sorted(outputs)}, the SavedModel has {sorted(expected)}", versions
    for name, value in outputs.items():
        if value.shape[:1] != (batch,):
            return f"Node.js check: output {name!r} has shape {list(value.shape)} for a batch of {batch}", versions
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            return f"Node.js check: output {name!r} has NaN or Inf", versions
    return "", versions


def convert_tfjs(saved_model_dir: Path, output_dir: Path, quantization: TfjsQuantization,
                 sample: dict[str, np.ndarray], expected_outputs: tuple[str, ...], timeout_s: float
                 ) -> TfjsConversionResult:
    """Convert `saved_model_dir` (signature `serving_default`) into `output_dir` and prove it in Node.js.

    Args:
        saved_model_dir: a SavedModel folder.
        output_dir: where the graph model goes (`<version>/tfjs`); replaced only when produced.
        quantization: weight quantization.
        sample: one real input batch {input name: [N, ...]} run in Node before the artifact counts.
        expected_outputs: the signature's output names.
        timeout_s: seconds for the conversion (the Node check has its own limit of the same size).

    Returns:
        The result; never raises for a conversion that is refused, crashes or times out.

    Raises:
        ConversionError: no SavedModel at `saved_model_dir` or a non-positive `timeout_s`.
    """
    started = time.monotonic()
    saved_model_dir, output_dir = Path(saved_model_dir).resolve(), Path(output_dir).resolve()
    if not (saved_model_dir / "saved_model.pb").is_file():
        raise ConversionError(f"no SavedModel at {str(saved_model_dir)!r} (saved_model.pb is missing)")
    if not timeout_s > 0:
        raise ConversionError(f"timeout_s must be positive seconds, got {timeout_s!r}")
    shutil.rmtree(output_dir, ignore_errors=True)  # a stale artifact must not look like this run's
    tmp = output_dir.with_name(f".{output_dir.name}.{uuid.uuid4().hex}.tmp")
    report = output_dir.with_name(f".{output_dir.name}.{uuid.uuid4().hex}.report.json")

    def result(status: ConversionStatus, reason: str, outputs=None, versions=None, path=None) -> TfjsConversionResult:
        return TfjsConversionResult(status, reason, path, folder_size(path) if path else 0,
                                    time.monotonic() - started, outputs or {}, versions or {}, reproduce)

    reproduce = ""
    try:
        interpreter = ensure_tfjs_venv()
        command = [str(interpreter), str(WORKER), "--saved-model", str(saved_model_dir),
                   "--output", str(tmp), "--quantization", quantization.value, "--report", str(report)]
        reproduce = shlex.join(command[:-2]) + ' --report "$(mktemp -u)"'
        _write_reproduce(output_dir.with_name(output_dir.name + ".reproduce.sh"), reproduce, output_dir, tmp)
        done, failure = _run_worker(command, report, timeout_s)
        if done is None:
            return result(ConversionStatus.CRASHED, failure)
        if done["status"] != ConversionStatus.PRODUCED:
            return result(ConversionStatus.REFUSED, done["reason"])
        reason, node_versions = _node_check(tmp, sample, expected_outputs, timeout_s)
        versions = {**done.get("versions", {}), **node_versions}
        if reason:
            return result(ConversionStatus.REFUSED, reason, done["outputs"], versions)
        os.replace(tmp, output_dir)
        return result(ConversionStatus.PRODUCED, "", done["outputs"], versions, output_dir)
    except ConversionError as err:  # the converter's environment could not be built
        return result(ConversionStatus.REFUSED, str(err))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        report.unlink(missing_ok=True)


def _write_reproduce(path: Path, command: str, output_dir: Path, tmp: Path) -> None:
    line = command.replace(shlex.quote(str(tmp)), shlex.quote(str(output_dir)))
    script = "\n".join(["#!/usr/bin/env bash", "# Reproduces tfship's TF.js conversion (tfjs.convert.convert_tfjs).",
                        "set -euo pipefail", f"cd {shlex.quote(str(ROOT))}", line, ""])
    staged = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    staged.write_text(script)
    staged.chmod(0o755)
    os.replace(staged, path)

"""ONNX conversion through tf2onnx's SavedModel route, in a child process with a time limit.

`tf2onnx.convert.from_keras` is not used: it is broken on Keras 3. The SavedModel route keeps the
signature's input and output names (tf2onnx names ONNX tensors after the `signature_def` keys).
The opset is pinned by config (`convert.onnx_opset`, default 17); the batch axis stays dynamic.
Optionally (`convert.onnx_simplify`) onnxslim simplifies the checked file in a second child process;
the simplified file is checked again and is what the parity gate judges.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfship.core.contract import Signature
from tfship.core.errors import ConversionError
from tfship.core.processes import run_converter_child
from tfship.onnx_format.large_models import onnx_needs_external_data, repack_external_data


@dataclass(frozen=True)
class OnnxResult:
    """A checked ONNX artifact: path, opset, size in bytes, conversion seconds, reproduce command, and the
    largest peak resident memory of its converter children in bytes (tf2onnx, onnxslim).
    """

    path: Path
    opset: int
    size_bytes: int
    seconds: float
    reproduce_command: str
    peak_rss_bytes: int = 0


def onnx_command(saved_model_dir: Path, output: Path, signature: str, opset: int) -> list[str]:
    """The exact tf2onnx command line that converts `saved_model_dir` (used and written to disk): tf2onnx's
    own arguments, run through `onnx_format.tf2onnx_lean` (same file, a fraction of the memory).
    """
    return [sys.executable, "-m", "tfship.onnx_format.tf2onnx_lean", "--saved-model", str(saved_model_dir),
            "--tag", "serve", "--signature_def", signature, "--opset", str(opset), "--output", str(output)]


def onnxslim_command(source: Path, output: Path) -> list[str]:
    """The onnxslim command line that simplifies `source` into `output` (pinned onnxslim)."""
    return [sys.executable, "-m", "onnxslim", str(source), str(output)]


def own_names(message: str, staged: dict[Path, Path]) -> str:
    """`message` with each temporary staging path (`.model.<hex>.onnx`) written as the file it stands for."""
    for temporary, final in staged.items():
        message = message.replace(str(temporary), str(final))
    return message


def _run(command: list[str], what: str, timeout_s: float, reproduce: str) -> int:
    """Run one converter child; returns its peak resident memory in bytes (`core.child_memory`)."""
    done = run_converter_child(command, what, max(1.0, timeout_s), env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if done.failure:
        raise ConversionError(f"onnx: {done.failure}; reproduce: {reproduce}")
    return done.peak_rss_bytes


def _unknown_ops(model) -> list[str]:
    import onnx

    unknown = set()
    for node in model.graph.node:
        domain = node.domain or ""
        if domain not in ("", "ai.onnx", "ai.onnx.ml", "com.microsoft") or not onnx.defs.has(node.op_type, domain):
            unknown.add(f"{domain + '::' if domain else ''}{node.op_type}")
    return sorted(unknown)


def check_onnx_artifact(path: Path, contract: Signature, sample: dict[str, np.ndarray]) -> None:
    """Full `onnx.checker` check, no unconverted TF ops, names equal to the contract, one ORT run.

    Args:
        path: the .onnx file.
        contract: the SavedModel's signature contract (names and dtypes).
        sample: one batch per input name, e.g. {"image": float32 [B, 8, 8, 1]}.

    Raises:
        ConversionError: naming the check that failed.
    """
    import onnx
    import onnxruntime as ort

    try:  # by path: the checker reads external data itself, and no Python copy of the weights is made for it
        onnx.checker.check_model(str(path), full_check=True)
        model = onnx.load(str(path), load_external_data=False)  # the graph; inline weights come along
    except Exception as err:
        raise ConversionError(f"{path}: onnx.checker failed: {err}") from err
    unknown = _unknown_ops(model)
    if unknown:
        raise ConversionError(f"{path}: tf2onnx left unconverted TensorFlow ops: {', '.join(unknown)}")
    input_names = [i.name for i in model.graph.input]
    output_names = [o.name for o in model.graph.output]
    want_in = list(contract.input_names())
    want_out = list(contract.output_names())
    if sorted(input_names) != sorted(want_in) or sorted(output_names) != sorted(want_out):
        raise ConversionError(f"{path}: ONNX names inputs {input_names} outputs {output_names}; "
                              f"the signature has inputs {want_in} outputs {want_out}")
    for graph_input in model.graph.input:
        first = graph_input.type.tensor_type.shape.dim[0] if graph_input.type.tensor_type.shape.dim else None
        if first is not None and first.HasField("dim_value"):
            raise ConversionError(f"{path}: input '{graph_input.name}' has a fixed batch size {first.dim_value}; "
                                  "expected a dynamic batch axis")
    del model  # one copy of the weights at a time: ONNX Runtime loads its own
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outputs = session.run(None, {k: np.asarray(v).astype(str).astype(object) if np.asarray(v).dtype.kind in "OSU"
                                     else v for k, v in sample.items()})
    except Exception as err:
        raise ConversionError(f"{path}: onnxruntime could not load or run the model: {err}") from err
    for name, value in zip(output_names, outputs):
        if np.issubdtype(value.dtype, np.floating) and not np.all(np.isfinite(value)):
            raise ConversionError(f"{path}: output '{name}' holds NaN or Inf on a real input batch")


def convert_to_onnx(saved_model_dir: Path, output: Path, contract: Signature, opset: int,
                    sample: dict[str, np.ndarray], timeout_s: float, simplify: bool = False,
                    size_limit_bytes: int = 2**31 - 1) -> OnnxResult:
    """Convert a SavedModel signature to ONNX in a child process, then check the artifact.

    The file is written under a temporary name in the output folder and renamed into place only
    after every check passed; `<output>.reproduce.sh` holds the command(s). With `simplify`, onnxslim
    rewrites the checked file (second child process, same time budget) and every check runs again.
    When the SavedModel's weights exceed `size_limit_bytes` (protobuf's 2 GiB by default), tf2onnx's
    large-model path is taken and the result is `output` + `<output>.data` (ONNX external data,
    `onnx_format.large_models`), checked and loaded that way.

    Raises:
        ConversionError: the converter failed, crashed (naming the signal) or timed out (seconds),
            or the artifact failed a check.
    """
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    if onnx_needs_external_data(saved_model_dir, size_limit_bytes):
        if simplify:
            raise ConversionError(f"onnx: the model's weights exceed {size_limit_bytes} bytes (external data); "
                                  "onnxslim cannot rewrite external-data models: set convert.onnx_simplify = false")
        return _convert_external(saved_model_dir, output, contract, opset, sample, timeout_s)
    token = secrets.token_hex(4)
    staging = output.with_name(f".{output.stem}.{token}.onnx")
    slim = output.with_name(f".{output.stem}.{token}.slim.onnx")
    command = onnx_command(saved_model_dir, staging, contract.name, opset)
    steps = [shlex.join(onnx_command(saved_model_dir, output, contract.name, opset))]
    if simplify:
        steps.append(shlex.join(onnxslim_command(output, output)))
    reproduce = " && ".join(steps)
    output.with_name(output.name + ".reproduce.sh").write_text("#!/bin/sh\nset -e\n" + "\n".join(steps) + "\n",
                                                               encoding="utf-8")
    started = time.perf_counter()
    try:
        peak = _run(command, "tf2onnx", timeout_s, reproduce)
        if not staging.exists():
            raise ConversionError(f"onnx: tf2onnx wrote no file; reproduce: {reproduce}")
        check_onnx_artifact(staging, contract, sample)
        if simplify:
            peak = max(peak, _run(onnxslim_command(staging, slim), "onnxslim",
                                  timeout_s - (time.perf_counter() - started), reproduce))
            check_onnx_artifact(slim, contract, sample)
            os.replace(slim, staging)
        os.replace(staging, output)
    except ConversionError as err:
        raise ConversionError(own_names(str(err), {staging: output, slim: output})) from err
    finally:
        staging.unlink(missing_ok=True)
        slim.unlink(missing_ok=True)
    return OnnxResult(output, opset, output.stat().st_size, time.perf_counter() - started, reproduce, peak)


def _large_command(saved_model_dir: Path, archive: Path, signature: str, opset: int) -> list[str]:
    """tf2onnx's command line with `--large_model` (through `onnx_format.tf2onnx_lean`)."""
    return [*onnx_command(saved_model_dir, archive, signature, opset), "--large_model"]


def _convert_external(saved_model_dir: Path, output: Path, contract: Signature, opset: int,
                      sample: dict[str, np.ndarray], timeout_s: float) -> OnnxResult:
    """tf2onnx `--large_model` into a hidden staging folder, repacked to `output` + `<output>.data`, checked,
    then both moved into place (data first); a failure or kill leaves only the hidden folder, removed here.
    """
    stage = output.with_name(f".{output.stem}.{secrets.token_hex(4)}.large")
    stage.mkdir()
    data = output.with_name(output.name + ".data")
    command = _large_command(saved_model_dir, stage / "tf2onnx.zip", contract.name, opset)
    reproduce = (shlex.join(_large_command(saved_model_dir, output.with_suffix(".zip"), contract.name, opset))
                 + f"  # then unzip and save with one external file {data.name}")
    output.with_name(output.name + ".reproduce.sh").write_text(f"#!/bin/sh\nset -e\n{reproduce}\n", encoding="utf-8")
    started = time.perf_counter()
    try:
        peak = _run(command, "tf2onnx --large_model", timeout_s, reproduce)
        if not (stage / "tf2onnx.zip").exists():
            raise ConversionError(f"onnx: tf2onnx wrote no file; reproduce: {reproduce}")
        repack_external_data(stage / "tf2onnx.zip", stage / output.name)
        (stage / "tf2onnx.zip").unlink()
        check_onnx_artifact(stage / output.name, contract, sample)
        os.replace(stage / data.name, data)
        os.replace(stage / output.name, output)
    except ConversionError as err:
        raise ConversionError(own_names(str(err), {stage / "tf2onnx.zip": output.with_suffix(".zip"),
                                                   stage / output.name: output, stage: output.parent})) from err
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return OnnxResult(output, opset, output.stat().st_size + data.stat().st_size, time.perf_counter() - started,
                      reproduce, peak)

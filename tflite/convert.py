"""Convert a SavedModel's `serving_default` to one TFLite variant, each step in a child process.

Steps per variant, each a `python -m tfship.tflite.worker` child with the remaining time budget (inside the
convert stage, a warm child that runs the modes' steps in turn: `core.warm_children`):
1. `convert` (TensorFlow): float16 range warnings (`tflite.float16_check`), `TFLiteConverter.from_saved_model`,
   Flex retry.
2. `smoke` (LiteRT only): load the artifact, check names and dynamic batch against the SavedModel
   signature, run it once on a representative sample, require finite float outputs.

Statuses: `produced` (both steps passed), `refused` (a step reported why it declined or failed: unsupported
or Flex ops, converter error, contract mismatch, LiteRT error), `crashed` (a child
died — the reason names the signal —, exited non-zero without a report (an unexpected Python exception; the
reason carries the output tail), or ran past the time limit and was killed with SIGKILL).

Files: the artifact is written under a temporary name in the destination folder and moved into place with
`os.replace` only when produced; on any other status `output_path` does not exist afterwards. Always kept:
`<output_path>.reproduce.sh` (the commands that reproduce the conversion and its LiteRT check) and, when
representative inputs were given, `<output_path>.representative.npz` which that script reads.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tfship.core.errors import ConversionError
from tfship.core.files import write_npz
from tfship.core.scratch import scratch_folder
from tfship.core.statuses import ConversionStatus
from tfship.core.warm_children import run_warm_or_cold
from tfship.tflite.modes import TfliteMode, TfliteOptions

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class TfliteConversionResult:
    """The outcome of one TFLite variant.

    Attributes:
        mode: the variant's mode.
        status: `produced`, `refused` or `crashed` (see the module docstring).
        reason: why it was refused or crashed; empty when produced.
        path: the artifact when produced, else None.
        size_bytes: artifact size in bytes; 0 when not produced.
        seconds: wall-clock seconds for the whole call (both child processes included).
        flex_ops: Flex op names the artifact uses or would need (e.g. `("FlexCumprod",)`).
        reproduce_command: shell command line of the conversion step writing `output_path` and printing its
            JSON report; `<output_path>.reproduce.sh` runs it plus the LiteRT check.
        peak_rss_bytes: the largest peak resident memory of its child processes, bytes (0: none ran).
        signatures_left_out: {signature of the SavedModel: why the file does not carry it} (the worker's
            `signatures_left_out`: int8's others, or the ones the converter refused beside `serving_default`).
        warnings: what a static check found and left to the parity gate (float16: tensors above 65504, named;
            `tflite.float16_check.float16_warnings`).
    """

    mode: TfliteMode
    status: ConversionStatus
    reason: str
    path: Path | None
    size_bytes: int
    seconds: float
    flex_ops: tuple[str, ...]
    reproduce_command: str
    peak_rss_bytes: int = 0
    signatures_left_out: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready values (for the run folder)."""
        return {
            "mode": self.mode.value, "status": self.status.value, "reason": self.reason,
            "path": None if self.path is None else str(self.path), "size_bytes": self.size_bytes,
            "seconds": round(self.seconds, 3), "flex_ops": list(self.flex_ops),
            "reproduce_command": self.reproduce_command, "peak_rss_bytes": self.peak_rss_bytes,
        }


@dataclass(frozen=True)
class _Step:
    report: dict[str, Any] | None
    failure: str  # non-empty when the child died, failed without a report or timed out
    peak_rss_bytes: int = 0


def _worker_command(step: str, **flags: str | None) -> list[str]:
    command = [sys.executable, "-m", "tfship.tflite.worker", step]
    for flag, value in flags.items():
        if value is not None:
            command += [f"--{flag.replace('_', '-')}", value]
    return command


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _run_child(command: list[str], name: str, deadline: float, total_s: float) -> _Step:
    """Run one worker step until `deadline` (time.monotonic()); its process group is killed at the deadline."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return _Step(None, f"timed out: the {total_s:g} s limit was spent before the {name} step")
    report_path = Path(command[command.index("--report") + 1])
    done = run_warm_or_cold(command, f"{name} worker", remaining, report=report_path, env=_child_env(),
                            cwd=REPO_ROOT)  # a warm child inside the convert stage (`core.warm_children`)
    if done.returncode is None:
        return _Step(None, f"timed out after {total_s:g} s in the {name} step (worker killed with SIGKILL)",
                     done.peak_rss_bytes)
    if done.failure:
        return _Step(None, done.failure, done.peak_rss_bytes)
    return _Step(json.loads(report_path.read_text()), "", done.peak_rss_bytes)


def _write_representative(path: Path, inputs: dict[str, np.ndarray]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp.npz")
    try:
        write_npz(tmp, {name: np.asarray(value) for name, value in inputs.items()})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_reproduce(path: Path, options: TfliteOptions, convert: list[str], smoke: list[str]) -> None:
    script = "\n".join([
        "#!/usr/bin/env bash",
        f"# Reproduces tfship's TFLite {options.mode.value!r} conversion (tflite.convert.convert_tflite)",
        "# and its LiteRT check; the reports (status, reason) are printed at the end.",
        "set -euo pipefail",
        f"cd {shlex.quote(str(REPO_ROOT))}",
        f"export PYTHONPATH={shlex.quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}",
        'reports="$(mktemp -d)"',
        'trap \'rm -rf "$reports"\' EXIT',
        shlex.join(convert).replace(shlex.quote("$REPORTS/convert.json"), '"$reports/convert.json"'),
        shlex.join(smoke).replace(shlex.quote("$REPORTS/convert.json"), '"$reports/convert.json"')
                         .replace(shlex.quote("$REPORTS/smoke.json"), '"$reports/smoke.json"'),
        'cat "$reports/convert.json" "$reports/smoke.json"',
        "",
    ])
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(script)
    tmp.chmod(0o755)
    os.replace(tmp, path)


@dataclass(frozen=True)
class _WorkerCommands:
    """The worker command lines of one variant (`python -m tfship.tflite.worker convert|smoke ...`)."""

    saved_model_dir: Path
    options_json: str  # `TfliteOptions.to_mapping()` as JSON, keys sorted
    representative: str | None  # the `.representative.npz` path, or None when no inputs were given

    def convert(self, output: Path, report: str | None) -> list[str]:
        """The conversion step writing `output`; its JSON report goes to `report` (None: stdout)."""
        return _worker_command("convert", saved_model=str(self.saved_model_dir), output=str(output),
                               options=self.options_json, representative=self.representative, report=report)

    def smoke(self, model: Path, convert_report: str, report: str) -> list[str]:
        """The LiteRT check of `model` against the signature held in `convert_report`."""
        return _worker_command("smoke", model=str(model), signature=convert_report,
                               representative=self.representative, report=report)


@dataclass
class _VariantRun:
    """One variant's two worker steps against one deadline, and the result they make."""

    mode: TfliteMode
    commands: _WorkerCommands
    started: float  # time.monotonic() when `convert_tflite` was called
    timeout_s: float
    reproduce_command: str
    peaks: list[int] = field(default_factory=lambda: [0])  # each step's peak resident bytes

    def result(self, status: ConversionStatus, reason: str, flex: list[str],
               path: Path | None = None) -> TfliteConversionResult:
        """The variant's result now (seconds since `started`, the largest peak so far)."""
        size = path.stat().st_size if path is not None else 0
        return TfliteConversionResult(self.mode, status, reason, path, size, time.monotonic() - self.started,
                                      tuple(flex), self.reproduce_command, max(self.peaks))

    def run_steps(self, tmp_model: Path, output_path: Path, reports: Path) -> TfliteConversionResult:
        """Convert to `tmp_model`, check it in LiteRT, and move it to `output_path` only when both passed."""
        deadline = self.started + self.timeout_s
        convert_report = str(reports / "convert.json")
        step = _run_child(self.commands.convert(tmp_model, convert_report), "convert", deadline, self.timeout_s)
        self.peaks.append(step.peak_rss_bytes)
        if step.failure or step.report is None:  # no failure: the report was read
            return self.result(ConversionStatus.CRASHED, step.failure, [])
        flex = list(step.report.get("flex_ops", []))
        if step.report["status"] != ConversionStatus.PRODUCED:
            return self.result(ConversionStatus.REFUSED, step.report["reason"], flex)
        smoke = _run_child(self.commands.smoke(tmp_model, convert_report, str(reports / "smoke.json")),
                           "LiteRT check", deadline, self.timeout_s)
        self.peaks.append(smoke.peak_rss_bytes)
        if smoke.failure or smoke.report is None:
            return self.result(ConversionStatus.CRASHED, smoke.failure, flex)
        if smoke.report["status"] != ConversionStatus.PRODUCED:
            prefix = (f"uses Flex ops {flex} (convert.allow_flex), which the bundled LiteRT (ai_edge_litert) "
                      "cannot run: it has no Flex delegate, so the file cannot be checked and is not kept; "
                      if flex else "")
            return self.result(ConversionStatus.REFUSED, prefix + smoke.report["reason"], flex)
        os.replace(tmp_model, output_path)
        return replace(self.result(ConversionStatus.PRODUCED, "", flex, output_path),
                       signatures_left_out=dict(step.report.get("signatures_left_out") or {}),
                       warnings=tuple(step.report.get("warnings") or ()))


def _check_request(saved_model_dir: Path, options: TfliteOptions,
                   representative_inputs: dict[str, np.ndarray] | None, timeout_s: float) -> None:
    """Raise `ConversionError` for a request no conversion can serve (see `convert_tflite`)."""
    if not (saved_model_dir / "saved_model.pb").is_file():
        raise ConversionError(f"no SavedModel at {str(saved_model_dir)!r} (saved_model.pb is missing)")
    if options.mode is TfliteMode.INT8 and not representative_inputs:
        raise ConversionError("mode 'int8' needs representative_inputs (signature input name -> array)")
    if not timeout_s > 0:
        raise ConversionError(f"timeout_s must be positive seconds, got {timeout_s!r}")


def _representative_file(output_path: Path, inputs: dict[str, np.ndarray] | None) -> str | None:
    """Write `<output_path>.representative.npz` when inputs were given; its path, else None."""
    if not inputs:
        return None
    representative = output_path.with_name(output_path.name + ".representative.npz")
    _write_representative(representative, inputs)
    return str(representative)


def convert_tflite(saved_model_dir: Path, output_path: Path, options: TfliteOptions,
                   representative_inputs: dict[str, np.ndarray] | None,
                   timeout_s: float) -> TfliteConversionResult:
    """Convert `saved_model_dir`'s `serving_default` signature to one `.tflite` variant and prove it runs.

    The TFLite signature keeps the SavedModel's input and output names and its dynamic batch dimension
    (`shape_signature[0] == -1`). int8 uses the first `options.representative_samples` rows of
    `representative_inputs` for calibration (one row per `representative_dataset` step); float I/O by
    default, int8 I/O with `options.int8_io == "int8"`; integer outputs such as an int64 argmax stay int64
    (the converter leaves non-float tensors unquantized). The LiteRT check runs the first 3 rows of
    `representative_inputs`, or seeded random float / zero integer inputs when None.

    Args:
        saved_model_dir: a SavedModel folder with a `serving_default` signature.
        output_path: where the `.tflite` file goes (its folder is created).
        options: the variant.
        representative_inputs: signature input name → array `[N, ...]` with the signature's dtype and
            shape (N >= 1, same N for every input). Required for int8; optional otherwise.
        timeout_s: wall-clock seconds for both steps together; past it the child is killed and the
            variant is `crashed`.

    Returns:
        The variant's result; never raises for a conversion that fails, crashes or times out.

    Raises:
        ConversionError: the caller's request is unusable (no SavedModel at `saved_model_dir`, int8
            without representative inputs, a non-positive `timeout_s`).
    """
    started = time.monotonic()
    saved_model_dir, output_path = Path(saved_model_dir).resolve(), Path(output_path).resolve()
    _check_request(saved_model_dir, options, representative_inputs, timeout_s)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    output_path.unlink(missing_ok=True)  # a stale artifact must not look like this run's
    commands = _WorkerCommands(saved_model_dir, json.dumps(options.to_mapping(), sort_keys=True),
                               _representative_file(output_path, representative_inputs))
    tmp_model = output_path.with_name(f".{output_path.name}.{uuid.uuid4().hex}.tmp")
    reproduce = commands.convert(output_path, None)  # the report goes to stdout
    _write_reproduce(output_path.with_name(output_path.name + ".reproduce.sh"), options,
                     commands.convert(output_path, "$REPORTS/convert.json"),
                     commands.smoke(output_path, "$REPORTS/convert.json", "$REPORTS/smoke.json"))
    run = _VariantRun(options.mode, commands, started, timeout_s, shlex.join(reproduce))
    with scratch_folder("tflite") as reports:
        try:
            return run.run_steps(tmp_model, output_path, Path(reports))
        finally:
            tmp_model.unlink(missing_ok=True)

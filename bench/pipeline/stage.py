"""One pipeline stage of `make bench-pipeline`, alone in this process (so its peak memory is its own).

    python -m bench.pipeline.stage STAGE --run RUN --model MODEL.keras --data DATA.npz --repository REPO

STAGE: `export` (export + audit + behaviour checks, as `tfship run --model`), `audit` (the graph audit
alone), `onnx`, `tflite_<mode>` (one conversion each, through the pipeline's own converters with their
child process and time limit), `convert` (the whole convert stage: every conversion, side by side),
`validate`, `serve_check`, `publish`. Prints one JSON line: {"stage", "seconds", "parts": {...}, "detail"}.
Stages run on the real code (`pipeline.orchestration.steps`); only the config below is the benchmark's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tfship.tflite.modes import TFLITE_MODES


def config(run: Path, repository: Path, timeout_s: float, workers: int | None = None):
    """The pipeline config of the benchmark: every TFLite mode, per-conversion limit `timeout_s`."""
    from tfship.pipeline.config import load_config

    overrides = {"run.model_name": "wide", "run.runs_dir": str(run.parent), "publish.repository": str(repository),
                 "convert.tflite_modes": list(TFLITE_MODES), "convert.timeout_seconds": timeout_s}
    if workers:
        overrides["convert.max_workers"] = workers
    return load_config(None, overrides)


def _data(cfg, run, data: Path):
    from tfship.pipeline.export_only.user_model import load_user_data
    from tfship.pipeline.orchestration import steps

    return load_user_data(data, steps.read_contract(run), cfg.convert.representative_samples, cfg.run.seed)


def run_stage(stage: str, run_dir: Path, model: Path, data: Path, repository: Path, timeout_s: float,
              workers: int | None) -> dict:
    """Run `stage` and time it; returns the JSON line's dict."""
    from tfship.pipeline.orchestration import steps
    from tfship.pipeline.orchestration.stages import RunFolder

    cfg, run = config(run_dir, repository, timeout_s, workers), RunFolder(run_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    started, parts, detail = time.perf_counter(), {}, None
    if stage == "export":
        from tfship.pipeline.export_only.user_model import load_user_model

        keras_model = load_user_model(str(model))
        parts["load_model"] = time.perf_counter() - started
        exported, _ = steps.export_user_stage(cfg, run, keras_model, data)
        detail = {"audit_passed": exported.audit.passed}
    elif stage == "audit":
        from tfship.signatures.audit import audit_saved_model

        detail = {"passed": audit_saved_model(run.artifacts).passed}
    elif stage in ("onnx", *(f"tflite_{m}" for m in TFLITE_MODES)):
        detail = _one_conversion(stage, cfg, run, _data(cfg, run, data))
        _record_outcome(run, stage, detail, time.perf_counter() - started)
    elif stage == "convert":
        result = steps.convert_stage(cfg, run, _data(cfg, run, data))
        detail = {o.name: {"status": o.status, "seconds": o.seconds, "reason": o.reason[:300],
                           "peak_memory_bytes": o.peak_memory_bytes} for o in result.outcomes}
        detail["memory_plan"] = result.memory
    elif stage == "validate":
        detail = {"passed": steps.validate_stage(cfg, run, _data(cfg, run, data)).passed}
    elif stage == "serve_check":
        checked = steps.serve_check_stage(cfg, run, _data(cfg, run, data))
        detail = {"passed": checked.passed, "artifacts": {name: {"backend": row.backend, "passed": row.passed, "reason": row.reason}
                                                          for name, row in checked.artifacts.items()}}
    elif stage == "publish":
        published = steps.publish_stage(cfg, run, _data(cfg, run, data), repository, {})
        detail = {"version": published.version, "path": str(published.version_dir)}
    else:
        raise SystemExit(f"unknown stage {stage!r}")
    return {"stage": stage, "seconds": time.perf_counter() - started, "parts": parts, "detail": detail}


def _record_outcome(run, stage: str, detail: dict, seconds: float) -> None:
    """Add this conversion's row to `convert.json` (the convert stage's format), so publish finds every
    conversion's outcome when the side-by-side convert stage is skipped (it rewrites the file when it runs)."""
    path = run.root / "convert.json"
    rows = [r for r in (json.loads(path.read_text()) if path.is_file() else []) if r["name"] != stage]
    rows.append({"name": stage, "status": detail.get("status", "produced"), "reason": detail.get("reason", ""),
                 "path": "", "size_bytes": detail.get("size_bytes", 0), "seconds": round(seconds, 2),
                 "reproduce_command": ""})
    run.write_json("convert.json", rows)


def _one_conversion(stage: str, cfg, run, data) -> dict:
    from tfship.onnx_format.convert import convert_to_onnx
    from tfship.pipeline.orchestration import steps
    from tfship.tflite.formats import tflite_filename

    contract = steps.read_contract(run)
    if stage == "onnx":
        sample = {k: v[:8] for k, v in data.inputs.items()}
        done = convert_to_onnx(run.artifacts, run.artifacts / "model.onnx", contract, cfg.convert.onnx_opset, sample,
                               cfg.convert.timeout_seconds)
        return {"status": "produced", "size_bytes": done.size_bytes}
    from tfship.tflite.convert import convert_tflite
    from tfship.tflite.modes import TfliteMode, TfliteOptions

    mode = stage.removeprefix("tflite_")
    options = TfliteOptions(mode=TfliteMode(mode), representative_samples=cfg.convert.representative_samples)
    done = convert_tflite(run.artifacts, run.artifacts / tflite_filename(mode), options, data.calibration,
                          cfg.convert.timeout_seconds)
    return {"status": done.status, "reason": done.reason[:300], "size_bytes": done.size_bytes}


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m bench.pipeline.stage")
    p.add_argument("stage")
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--repository", type=Path, required=True)
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--workers", type=int, default=0)
    a = p.parse_args(argv)
    out = run_stage(a.stage, a.run.resolve(), a.model, a.data, a.repository.resolve(), a.timeout_s, a.workers or None)
    sys.stdout.write("RESULT " + json.dumps(out, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Float32 implementation noise on real architectures: how far a correct float32 file strays from the
SavedModel, against how far the SavedModel itself strays from its own float64 evaluation.

    python -m bench.gate.float32_noise [--members resnet50,densenet121,efficientnetb0] [--seeds 0,1,2] [--rows 32]

Per member (`bench.zoo.members`, keras.applications, random weights, BatchNorm statistics from synthetic
photographs): the Keras model is exported (`model.export`, the export route), converted to TFLite float32
(`tflite.convert.convert_tflite`) and ONNX (`onnx_format.convert.convert_to_onnx`), then for each
seed of held-out photographs: the SavedModel's batch noise (batch 1 and 7 against the full batch, and a repeat,
`pipeline.gate.noise.reference_noise`), its float32 error against float64 (`pipeline.gate.float64`), each
file's error against the SavedModel and against float64 (through the serving runtimes, XNNPACK LiteRT and ONNX
Runtime), and the gate's verdict with the default [validate] settings (`pipeline.gate.validate.check_artifact`).
Writes <out>/float32-noise-latest.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from tfship.core.saved_model import read_signatures
from tfship.pipeline.config import ValidateSection
from tfship.pipeline.conversion.artifacts import Artifact, open_runner
from tfship.pipeline.gate.float64 import float64_outputs
from tfship.pipeline.gate.noise import implementation_noise, reference_noise, truth_errors
from tfship.pipeline.gate.task_metric import infer_task
from tfship.pipeline.gate.validate import check_artifact, run_batched


def _convert(saved_model: Path, folder: Path, sample: dict[str, np.ndarray]) -> list[Artifact]:
    from tfship.onnx_format.convert import convert_to_onnx
    from tfship.tflite.convert import convert_tflite
    from tfship.tflite.modes import TfliteMode, TfliteOptions

    contract = read_signatures(saved_model)["serving_default"]
    convert_tflite(saved_model, folder / "model.tflite", TfliteOptions(TfliteMode.FLOAT32), None, 1800.0)
    convert_to_onnx(saved_model, folder / "model.onnx", contract, 17, sample, 1800.0)
    return [Artifact("tflite_float32", "tflite", "float32", folder / "model.tflite"),
            Artifact("onnx", "onnx", "float32", folder / "model.onnx")]


def measure_member(name: str, seeds: list[int], rows: int, work: Path) -> list[dict]:
    """One row per (member, seed, artifact): noises, errors and the gate's verdict (module docstring)."""
    import keras

    from bench.zoo.members import MEMBERS, synthetic_photos

    member = MEMBERS[name]
    model, sample = member.build(16)
    saved_model = work / name / "1"
    model.export(str(saved_model), verbose=False)
    (input_name,) = read_signatures(saved_model)["serving_default"].inputs
    preprocess = {"resnet50": keras.applications.resnet50, "densenet121": keras.applications.densenet}.get(name)
    del model
    artifacts = _convert(saved_model, saved_model, {input_name: next(iter(sample.values()))[:2]})
    settings, results = ValidateSection(), []
    reference = Artifact("saved_model", "saved_model", "float32", saved_model)
    for seed in seeds:
        photos = synthetic_photos(rows, 224, seed=1000 + seed)
        inputs = {input_name: (preprocess.preprocess_input(photos) if preprocess else photos).astype(np.float32)}
        runner = open_runner(reference)
        by_batch = {size: run_batched(runner, inputs, size) for size in (1, 7, rows)}
        noise = reference_noise(by_batch, run_batched(runner, inputs, rows))
        del runner
        truth, why = float64_outputs(saved_model, inputs, 8)
        implementation = implementation_noise(by_batch[rows], truth, why)
        task = infer_task(by_batch[rows], None)
        contract = read_signatures(saved_model)["serving_default"]
        for artifact in artifacts:
            if not artifact.path.exists():
                results.append({"member": name, "seed": seed, "artifact": artifact.name, "error": "not converted"})
                continue
            runner = open_runner(artifact)
            outputs = run_batched(runner, inputs, rows)
            verdict = check_artifact(artifact, runner, inputs, task, by_batch[rows], task.score(by_batch[rows]),
                                     contract, settings, noise, None, implementation, truth)
            del runner
            for output, value in noise.items():
                vs_ref = float(np.max(np.abs(outputs[output].astype(np.float64) - by_batch[rows][output])))
                results.append({
                    "member": name, "seed": seed, "artifact": artifact.name, "output": output,
                    "batch_noise": value.max_abs, "implementation_noise": implementation[output].max_abs,
                    "error_vs_reference": vs_ref,
                    "error_vs_float64": truth_errors(outputs, truth or {}).get(output),
                    "ratio_to_implementation_noise": vs_ref / implementation[output].max_abs
                    if implementation[output].max_abs else None,
                    "passed": verdict.passed, "reason": verdict.reason[:300]})
            print(json.dumps(results[-1]), flush=True)
    return results


def _markdown(rows: list[dict], started: str, command: str) -> str:
    lines = [f"# Float32 implementation noise ({started})", "", f"Command: `{command}`", "",
             "Errors are max |.| over every element of the output; noise columns are the SavedModel's own "
             "(batch: between batch sizes 1/7/all and a repeat; implementation: its float32 rounding error against "
             "the same graph in float64). Verdict: the gate with default [validate] settings.", "",
             "| member | seed | artifact | output | batch noise | implementation noise | error vs SavedModel | "
             "error vs float64 | error / impl. noise | verdict |", "|---|---:|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if "output" not in r:
            lines.append(f"| {r['member']} | {r['seed']} | {r['artifact']} | | | | | | | {r['error']} |")
            continue
        ratio = f"{r['ratio_to_implementation_noise']:.2f}" if r["ratio_to_implementation_noise"] else "-"
        vs64 = f"{r['error_vs_float64']:.3g}" if r["error_vs_float64"] is not None else "-"
        lines.append(f"| {r['member']} | {r['seed']} | {r['artifact']} | {r['output']} | {r['batch_noise']:.3g} | "
                     f"{r['implementation_noise']:.3g} | {r['error_vs_reference']:.3g} | {vs64} | {ratio} | "
                     f"{'pass' if r['passed'] else 'FAIL: ' + r['reason']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Measure, print one JSON line per row, write the JSON and Markdown results."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--members", default="resnet50,densenet121,efficientnetb0")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    args = p.parse_args()
    started, rows = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), []
    with tempfile.TemporaryDirectory(prefix="tfship-float32-noise-") as work:
        for name in args.members.split(","):
            rows += measure_member(name, [int(s) for s in args.seeds.split(",")], args.rows, Path(work))
    command = (f"python -m bench.gate.float32_noise --members {args.members} --seeds {args.seeds} "
               f"--rows {args.rows}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "float32-noise-latest.json").write_text(json.dumps({"date": started, "command": command,
                                                                     "rows": rows}, indent=1))
    (args.out / "float32-noise-latest.md").write_text(_markdown(rows, started, command))


if __name__ == "__main__":
    main()

"""`make gpu-check`: prove on an NVIDIA GPU machine what a cloud user relies on, in one command.

    python -m bench.gpu_check [--out bench/results] [--parts training,serving,...] [--budget-s 460] [--quick]

Parts (bench/gpu_check/parts.py): `training` (the digits CNN's XLA step on GPU in float32, mixed_float16 with
loss scaling and mixed_bfloat16 against CPU), `training_loop` (`tfship train` against a hand-written Keras fit on
the GPU, bench/train/loop_vs_fit.py's MLP and CNN cases, with nvidia-smi's utilisation), `publish` (`tfship run`
per precision on GPU publishes a float32 SavedModel that passed the gate), `serving` (SavedModel on GPU and ONNX
Runtime's CUDA provider, heavy MLP and ResNet50, c=1/8/32, batching on/off, GPU memory, providers read back),
`multi_model` (--per_process_gpu_memory_fraction), `cloud_image` (`docker run --gpus all`) and `scaling`
(--num-processes 1/2/4/8 on CPU). Without a GPU the CPU parts run and every other part says why it was skipped.
Prints one table; writes gpu-check-latest.json and .md under `--out`.
Exit status: 1 if any part failed, else 0 (skips are not failures).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.gpu_check import probe
from bench.gpu_check.parts import PARTS, Context, run_part
from bench.gpu_check.report import PartStatus, document, write


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--budget-s", type=float, default=460.0, help="parts not started by then are skipped")
    parser.add_argument("--quick", action="store_true", help="short windows, small models (a smoke run)")
    args = parser.parse_args(argv)
    chosen = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown:
        parser.error(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    console = Console(stderr=True)
    started = time.time()
    machine = probe.machine()
    console.print(f"[bold]gpu-check[/] on {machine['cpu_cores']} cores, GPUs: {machine['gpus']}")
    with tempfile.TemporaryDirectory(prefix="tfship-gpu-check-") as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        ctx = Context(work=work, gpus=probe.gpus(), deadline=time.monotonic() + args.budget_s, quick=args.quick)
        results = []
        for name in chosen:
            console.print(f"[cyan]→ {name}[/] ({ctx.seconds_left():.0f} s of budget left)")
            results.append(run_part(name, PARTS[name], ctx))
            console.print(f"  {results[-1].status}: {results[-1].reason or 'ok'} ({results[-1].seconds} s)")
    doc = document(results, machine, started)
    paths = write(doc, args.out)
    table = Table(title="gpu-check")
    for column in ("part", "status", "seconds", "reason"):
        table.add_column(column)
    for r in results:
        table.add_row(r.name, str(r.status), f"{r.seconds:.1f}", r.reason or "")
    console.print(table)
    console.print("results: " + ", ".join(map(str, paths)))
    return 1 if any(r.status is PartStatus.FAILED for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())

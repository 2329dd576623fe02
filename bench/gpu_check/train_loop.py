"""The `training_loop` part of `make gpu-check`: `tfship train` against a hand-written Keras `fit` on the GPU
(bench/train/loop_vs_fit.py's tiny MLP and digits CNN cases, the same files, model, batch, Adam and XLA, and
the end-to-end marginal rate, cold: 200 k against 20 k records), with
the GPU's utilisation and memory sampled by nvidia-smi every half second while it runs.
"""

from __future__ import annotations

import json
import statistics
import threading

from bench.gpu_check import probe
from bench.gpu_check.report import PartResult, PartStatus

SAMPLE_EVERY_S = 0.5


class UtilisationSampler:
    """nvidia-smi's `utilization.gpu` (%) and `memory.used` (MiB) of GPU 0, sampled in a thread while entered."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S):
        self.every_s, self.samples = every_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        out = probe._run(["nvidia-smi", "--id=0", "--query-gpu=utilization.gpu,memory.used",
                          "--format=csv,noheader,nounits"], timeout_s=5.0)
        try:
            utilisation, memory = (float(part) for part in (out or "").strip().split(","))
        except ValueError:
            return  # not readable now (no nvidia-smi, [N/A] on this GPU): no sample
        self.samples.append((utilisation, memory))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def __enter__(self) -> UtilisationSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()

    def summary(self) -> dict:
        if not self.samples:
            return {"gpu_utilisation": "not readable (nvidia-smi gave no utilization.gpu sample)"}
        busy = [u for u, _ in self.samples]
        return {"gpu_utilisation_mean_pct": round(statistics.mean(busy), 1), "gpu_utilisation_max_pct": max(busy),
                "gpu_utilisation_samples": len(busy),
                "gpu_memory_used_max_mib": max(m for _, m in self.samples)}


def training_loop(ctx, need_gpu, python) -> PartResult:
    """`tfship train` vs Keras fit on the GPU (tiny MLP, digits CNN), ratios taken within one run, and the GPU's
    utilisation while both ran; skipped without a GPU. `need_gpu(ctx, what)` raises Skip without one, `python(args,
    timeout_s=)` runs a child Python (both from `bench.gpu_check.parts`, passed in: parts imports this module).
    """
    need_gpu(ctx, "the tfship-vs-Keras-fit comparison on GPU")
    out, work = ctx.work / "train-loop", ctx.work / "train-loop-work"
    args = ["-m", "bench.train.loop_vs_fit", "--cases", "mlp,cnn", "--e2e-variants", "cold", "--out", str(out),
            "--work", str(work)]
    args += ["--quick"] if ctx.quick else ["--records", "200000", "--repeats", "1", "--cnn-epochs", "30"]
    with UtilisationSampler() as sampler:
        python(args, timeout_s=max(60.0, min(900.0, ctx.seconds_left())))
    doc = json.loads((out / "train-loop-latest.json").read_text())
    rows = [{"case": c["case"], "tfship_records_per_s": c["tfship"], "keras_fit_records_per_s": c["reference"],
             "reference": c["reference_detail"], "ratio": c["ratio"]["median"] if c["ratio"] else None,
             "target": c["target"] or "",
             "verdict": "NOT MEASURED" if c["ratio"] is None else "" if c["pass"] is None else (
                 "PASS" if c["pass"] else "MISS")} for c in doc["checks"]]
    facts = sampler.summary() | {"tfship_steps_per_execution": doc["tfship_steps_per_execution"],
                                 "report": str(out / "train-loop-latest.md")}
    return PartResult("training_loop", PartStatus.RAN, rows=rows, facts=facts)

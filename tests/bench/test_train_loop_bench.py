"""`make bench-train-loop` in its --quick mode (tiny data, one round): every case is in the JSON with finite,
positive figures and ratios, the Markdown table has a verdict per target, and the plot is written.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.timeout(600)
def test_quick_run_reports_every_case_with_finite_positive_figures(tmp_path: Path) -> None:
    out, work = tmp_path / "results", tmp_path / "work"
    done = subprocess.run([sys.executable, "-m", "bench.train.loop_vs_fit", "--quick", "--out", str(out), "--work",
                           str(work)], capture_output=True, text=True, cwd=ROOT, timeout=580, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "[bench-train-loop" in done.stderr  # progress lines while it runs
    doc = json.loads((out / "train-loop-latest.json").read_text())
    assert doc["schema"] == "tfship.train-loop-bench/1" and doc["all_figures_finite"] is True
    assert doc["host"]["cpus"] >= 1 and doc["repeats"] == 1
    cases = doc["cases"]
    assert set(cases) == {"mlp", "end_to_end", "cnn", "rec", "modes"}
    for name in ("mlp", "cnn", "rec"):
        summary = cases[name]["summary"]
        assert _positive(summary["tfship_records_per_second"]["median"]), name
        assert _positive(summary["tfship_whole_process_records_per_second"]["median"]), name
        by_spe = summary["reference_records_per_second_by_steps_per_execution"]
        assert by_spe and all(_positive(v["median"]) for v in by_spe.values()), name
        assert str(summary["reference_best_steps_per_execution"]) in by_spe
        assert _positive(summary["ratio"]["median"]) and len(summary["ratio"]["all"]) == 1, name
    assert set(cases["mlp"]["summary"]["reference_records_per_second_by_steps_per_execution"]) == {"1", "32"}
    assert cases["mlp"]["summary"]["pass"] in (True, False)
    e2e = cases["end_to_end"]["summary"]
    assert _positive(e2e["read_parse_records_per_second"]["median"]) and _positive(e2e["ratio"]["median"])
    modes = cases["modes"]
    assert {(r["mode"], r["precision"]) for r in modes["rows"].values()} >= {
        ("eager", "float32"), ("tf.function", "float32"), ("xla", "float32"), ("xla", "mixed_bfloat16")}
    assert len({r["user_table_rows"] for r in modes["rows"].values()}) == 2
    assert all(_positive(r["records_per_second"]["median"]) for r in modes["rows"].values())
    assert modes["ratios"]["records_per_second"] and all(
        _positive(v["median"]) for v in modes["ratios"]["records_per_second"].values())
    assert [c["case"] for c in doc["checks"]] == ["mlp", "cnn", "rec", "end_to_end"]
    table = (out / "train-loop-latest.md").read_text()
    assert table.count("| PASS |") + table.count("| MISS |") == 2  # the two targets: mlp >= 1.0, end to end >= 0.5
    assert (out / "train-loop-latest.png").stat().st_size > 1000


def test_the_gpu_check_part_reads_the_comparison_and_the_utilisation(tmp_path: Path, monkeypatch) -> None:
    """`make gpu-check`'s training_loop part on a (pretended) GPU host: the harness's checks become its rows, the
    nvidia-smi samples its facts; with no GPU it is skipped with the reason."""
    from bench.gpu_check import parts, probe, train_loop
    from bench.gpu_check.parts import Context, run_part

    skipped = run_part("training_loop", parts.PARTS["training_loop"], Context(work=tmp_path, gpus=[],
                                                                            deadline=float("inf")))
    assert skipped.status == "skipped" and "no NVIDIA GPU" in skipped.reason
    calls = []

    def fake_python(args, env=None, timeout_s=300.0):
        calls.append(args)
        out = Path(args[args.index("--out") + 1])
        out.mkdir(parents=True)
        checks = [{"case": "mlp", "tfship": 2.0e5, "reference": 1.6e5, "reference_detail": "K=256", "pass": True,
                   "ratio": {"median": 1.25}, "target": ">= 1.0"},
                  {"case": "cnn", "tfship": 9.0e4, "reference": 1.0e5, "reference_detail": "K=32", "pass": None,
                   "ratio": {"median": 0.9}, "target": None}]
        (out / "train-loop-latest.json").write_text(json.dumps({"checks": checks, "tfship_steps_per_execution": 7}))
        return ""

    monkeypatch.setattr(parts, "_python", fake_python)
    monkeypatch.setattr(probe, "_run", lambda cmd, timeout_s=20.0: "87, 1234\n")
    gpu = probe.Gpu(0, "Fake GPU", 80_000, "550")
    result = run_part("training_loop", parts.PARTS["training_loop"], Context(work=tmp_path, gpus=[gpu],
                                                                           deadline=float("inf"), quick=True))
    assert result.status == "ran", result.reason
    assert "--quick" in calls[0] and calls[0][:2] == ["-m", "bench.train.loop_vs_fit"]
    assert [(r["case"], r["ratio"], r["verdict"]) for r in result.rows] == [("mlp", 1.25, "PASS"), ("cnn", 0.9, "")]
    assert result.facts["gpu_utilisation_max_pct"] == 87.0 and result.facts["gpu_memory_used_max_mib"] == 1234.0
    assert result.facts["tfship_steps_per_execution"] == 7
    monkeypatch.setattr(probe, "_run", lambda cmd, timeout_s=20.0: None)
    with train_loop.UtilisationSampler(every_s=0.01) as sampler:
        pass
    assert "not readable" in sampler.summary()["gpu_utilisation"]

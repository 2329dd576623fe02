"""`make bench-train-loop`: its --quick mode on the MLP case (tiny data, one round, one reference K, the end-to-end
case's two tiny sizes) reports finite, positive figures, the scan's status and the layers' precision; the
end-to-end marginal rate, the block timing of the Keras reference and the declared-sizes config, without
TensorFlow; and the gpu-check part that reads the harness.
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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_mlp_run_reports_the_case_and_the_end_to_end_marginal(tmp_path: Path) -> None:
    out, work = tmp_path / "results", tmp_path / "work"
    done = subprocess.run([sys.executable, "-m", "bench.train.loop_vs_fit", "--quick", "--cases", "mlp",
                           "--e2e-variants", "cold", "--out", str(out), "--work", str(work)],
                          capture_output=True, text=True, cwd=ROOT, timeout=280, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "[bench-train-loop" in done.stderr  # progress lines while it runs
    doc = json.loads((out / "train-loop-latest.json").read_text())
    assert doc["schema"] == "tfship.train-loop-bench/1" and doc["all_figures_finite"] is True
    assert doc["host"]["cpus"] >= 1 and doc["repeats"] == 1
    cases = doc["cases"]
    assert set(cases) == {"mlp", "end_to_end"}
    summary = cases["mlp"]["summary"]
    assert _positive(summary["tfship_records_per_second"]["median"])
    assert "input.records_per_second" in summary["tfship_figure"] and "after the first" in summary["reference_figure"]
    assert set(summary["reference_records_per_second_by_steps_per_execution"]) == {"32"}
    assert _positive(summary["reference_records_per_second_by_steps_per_execution"]["32"]["median"])
    assert _positive(summary["ratio"]["median"]) and len(summary["ratio"]["all"]) == 1
    assert summary["pass"] in (True, False)
    tfship = cases["mlp"]["rounds"][0]["tfship"]
    assert tfship["layers"]["compute"] == "float32" and tfship["steps_measured"] == tfship["steps"] - 1
    fit = cases["mlp"]["rounds"][0]["reference"]["fits"][0]
    assert fit["first_block"]["steps"] == 32 and fit["steps_measured"] == fit["steps"] - 32
    e2e = cases["end_to_end"]
    assert e2e["records"] == {"big": 20_000, "small": 5_000, "held_out_each": 2000, "shards": 8}
    cold = e2e["variants"]["cold"]
    assert set(e2e["variants"]) == {"cold"} and _positive(cold["read_parse_records_per_second"]["median"])
    assert cold["scan"] == {"20,000": [cold["scan"]["20,000"][0]], "5,000": [cold["scan"]["5,000"][0]]}
    assert all(v[0].startswith("ran") for v in cold["scan"].values())
    assert all(_positive(v["median"]) for v in cold["wall_s"].values())
    # two tiny sizes: the marginal is positive, or not measurable when start-up noise swamps 15 k records
    assert cold["ratio"] is None or _positive(cold["ratio"]["median"])
    assert [c["case"] for c in doc["checks"]] == ["mlp", "end_to_end_cold"]
    table = (out / "train-loop-latest.md").read_text()
    assert table.count("| PASS |") + table.count("| MISS |") + table.count("| NOT MEASURED |") == 2
    assert "layers computed in: float32" in table and "**cold**" in table
    assert (out / "train-loop-latest.png").stat().st_size > 1000


def test_the_end_to_end_figure_is_the_marginal_rate_of_two_runs() -> None:
    from bench.train.loop_vs_fit import checks, end_to_end_summary

    def run(wall, scan):
        return {"wall_s": wall, "train_seconds": wall / 2, "scan": scan, "scan_seconds": 1.0}

    rounds = [{"tfship": run(60.0, "ran"), "tfship_small": run(15.0, "ran"),
               "tfship_declared": run(50.0, "skipped"), "tfship_small_declared": run(14.0, "skipped"),
               "reference": {"read": {"records_per_second": 40_000.0}}},
              {"tfship": run(10.0, "ran"), "tfship_small": run(12.0, "ran"),  # T_N <= T_n: not measurable
               "tfship_declared": run(51.0, "skipped"), "tfship_small_declared": run(15.0, "skipped"),
               "reference": {"read": {"records_per_second": 40_000.0}}}]
    cold = end_to_end_summary(rounds, "cold", 1_000_000, 100_000)
    assert cold["marginal_records_per_second"]["all"] == [20_000.0] and cold["marginal_rounds_measured"] == "1 of 2"
    assert cold["ratio"]["median"] == 0.5 and cold["pass"] is True and cold["scan"]["1,000,000"] == ["ran"]
    declared = end_to_end_summary(rounds, "declared", 1_000_000, 100_000)
    assert declared["marginal_records_per_second"]["all"] == [25_000.0, 25_000.0] and declared["pass"] is True
    none = end_to_end_summary(rounds[1:], "cold", 1_000_000, 100_000)
    assert none["ratio"] is None and none["pass"] is None and none["marginal_records_per_second"] is None
    rows = checks({"settings": {"big_table": 1}, "cases": {"end_to_end": {"variants": {"cold": none}}}})
    assert rows[0]["case"] == "end_to_end_cold" and rows[0]["ratio"] is None


def test_the_reference_leaves_out_its_first_block_as_tfship_does() -> None:
    from bench.train.loop_reference import measured_blocks

    # two epochs of 10 steps in blocks of 4 (4, 4, 2), then Keras's block that met the data's end (no step)
    epochs = [[(0, 0.0), (4, 5.0), (8, 6.0)], [(0, 8.0), (4, 9.0), (8, 10.0), (10, 10.5)]]
    blocks = measured_blocks(epochs, [6.5, 10.6], steps_per_epoch=10)
    assert blocks["first_block"] == {"steps": 4, "seconds": 5.0}
    assert blocks["steps"] == 16 and blocks["blocks"] == 5 and blocks["seconds"] == pytest.approx(1.5 + 2.6)


def test_the_declared_sizes_config_is_valid(tmp_path: Path) -> None:
    """The end-to-end case's `declared` variant: data.split_sizes as a TOML inline table tfship accepts."""
    from types import SimpleNamespace

    from bench.train.loop_vs_fit import mlp_config
    from tfship.pipeline.config import load_config

    paths = {"train": str(tmp_path / "part-*.tfrecord"), "validation": str(tmp_path / "v.tfrecord"),
             "test": str(tmp_path / "t.tfrecord")}
    text = mlp_config(paths, SimpleNamespace(tfship_spe="auto"), {"train": 900, "validation": 20, "test": 20})
    (tmp_path / "c.toml").write_text(text.replace("@RUNS@", str(tmp_path / "runs")))
    config = load_config(tmp_path / "c.toml")
    assert config.data.split_sizes == {"train": 900, "validation": 20, "test": 20}
    assert config.train.steps_per_execution == "auto"


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
                   "ratio": {"median": 0.9}, "target": None},
                  {"case": "end_to_end_cold", "tfship": None, "reference": 1.0e5, "reference_detail": "read",
                   "pass": None, "ratio": None, "target": ">= 0.5"}]
        (out / "train-loop-latest.json").write_text(json.dumps({"checks": checks, "tfship_steps_per_execution": 7}))
        return ""

    monkeypatch.setattr(parts, "_python", fake_python)
    monkeypatch.setattr(probe, "_run", lambda cmd, timeout_s=20.0: "87, 1234\n")
    gpu = probe.Gpu(0, "Fake GPU", 80_000, "550")
    result = run_part("training_loop", parts.PARTS["training_loop"], Context(work=tmp_path, gpus=[gpu],
                                                                           deadline=float("inf"), quick=True))
    assert result.status == "ran", result.reason
    assert "--quick" in calls[0] and calls[0][:2] == ["-m", "bench.train.loop_vs_fit"]
    assert [(r["case"], r["ratio"], r["verdict"]) for r in result.rows] == [
        ("mlp", 1.25, "PASS"), ("cnn", 0.9, ""), ("end_to_end_cold", None, "NOT MEASURED")]
    assert result.facts["gpu_utilisation_max_pct"] == 87.0 and result.facts["gpu_memory_used_max_mib"] == 1234.0
    assert result.facts["tfship_steps_per_execution"] == 7
    monkeypatch.setattr(probe, "_run", lambda cmd, timeout_s=20.0: None)
    with train_loop.UtilisationSampler(every_s=0.01) as sampler:
        pass
    assert "not readable" in sampler.summary()["gpu_utilisation"]

"""The convert stage in bounded memory: measured child peaks, the budget's schedule, and tf2onnx's lean path.

- `core.child_memory.run_measured` reports a child's peak resident memory (the kernel's high-water mark)
  and kills one that runs past its limit.
- `pipeline.conversion.memory_budget.run_within_budget` runs conversions side by side only while their
  predicted peaks fit, one after another otherwise, never drops one, and learns from measured peaks.
- `onnx_format.tf2onnx_lean` writes the same bytes as plain tf2onnx (a small conv + BatchNorm
  SavedModel, the kind of graph whose constants tf2onnx's optimizers fold) in less memory.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tfship.core.child_memory import available_memory_bytes, run_measured
from tfship.pipeline.config import load_config
from tfship.pipeline.conversion.memory_budget import (
    MIB,
    Budget,
    MemoryPlan,
    memory_budget,
    peak_model,
    run_within_budget,
)


def test_run_measured_reports_the_peak_and_kills_past_the_limit():
    grow = "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('done')"
    done = run_measured([sys.executable, "-c", grow], 60)
    assert done.returncode == 0 and b"done" in done.output and not done.timed_out
    assert done.peak_rss_bytes >= 300 * MIB
    slow = run_measured([sys.executable, "-c", "import time; time.sleep(60)"], 0.5)
    assert slow.timed_out and slow.returncode < 0 and slow.seconds < 30


def test_budget_is_a_share_of_available_memory_or_the_setting():
    settings = load_config(None, {}).convert
    budget = memory_budget(settings)
    assert budget.bytes == pytest.approx(settings.memory_share * available_memory_bytes(), rel=0.2)
    assert "memory_share" in budget.source and "available" in budget.source
    fixed = load_config(None, {"convert.memory_budget_bytes": 123 * MIB}).convert
    assert memory_budget(fixed) == Budget(123 * MIB, "convert.memory_budget_bytes")


def _fake_conversions(names, plan, peak_bytes, **scheduling):
    """Run `names` under `plan` with conversions that sleep 0.3 s; returns (outcomes, most at once)."""
    running, most, lock = set(), [0], threading.Lock()

    def convert(i):
        with lock:
            running.add(i)
            most[0] = max(most[0], len(running))
        time.sleep(0.3)
        with lock:
            running.discard(i)
        return {"name": names[i], "peak": peak_bytes}

    return run_within_budget(names, convert, plan, lambda outcome: outcome["peak"], **scheduling), most[0]


def test_conversions_that_do_not_fit_together_run_one_after_another():
    names = ["onnx", "tflite_float32", "tflite_int8"]
    weights = 100 * MIB  # predicted peaks: a few GiB each
    tight = MemoryPlan(Budget(5 * 2**29, "test"), 0, weights, workers=3)
    outcomes, most = _fake_conversions(names, tight, 0)
    assert [o["name"] for o in outcomes] == names and most == 1  # none dropped, never two at once
    assert all(r.end_s > r.start_s for r in tight.rows)
    assert any(r.waited_for_memory for r in tight.rows)
    roomy = MemoryPlan(Budget(64 * 2**30, "test"), 0, weights, workers=3)
    _, most = _fake_conversions(names, roomy, 0)
    assert most == 3 and not any(r.waited_for_memory for r in roomy.rows)


def test_a_warm_family_runs_one_at_a_time_beside_the_others():
    """`serial_families` (one warm child per family): its conversions never overlap each other, but do overlap
    the other families'; a wait for the family is not a wait for memory."""
    names = ["onnx", "tflite_float32", "tflite_float16", "tflite_int8"]
    plan = MemoryPlan(Budget(64 * 2**30, "test"), 0, MIB, workers=4)
    _, most = _fake_conversions(names, plan, 0, serial_families=("tflite",))
    tflite = sorted((r for r in plan.rows if r.name.startswith("tflite")), key=lambda r: r.start_s)
    assert all(later.start_s >= earlier.end_s for earlier, later in zip(tflite, tflite[1:]))
    assert most == 2 and not any(r.waited_for_memory for r in plan.rows)  # onnx beside one tflite
    free = MemoryPlan(Budget(64 * 2**30, "test"), 0, MIB, workers=4)
    assert _fake_conversions(names, free, 0)[1] == 4  # without it, all at once: the check can tell


def test_memory_held_by_idle_warm_children_counts_against_the_room():
    """`held_bytes`: two conversions that fit side by side run one after another once idle children hold the
    difference."""
    names = ["onnx", "tflite_float32"]
    weights = MIB
    room = sum(peak_model(name).predict(weights) for name in names) + 100 * MIB
    fits = MemoryPlan(Budget(room, "test"), 0, weights, workers=2)
    assert _fake_conversions(names, fits, 0, held_bytes=lambda: 50 * MIB)[1] == 2
    held = MemoryPlan(Budget(room, "test"), 0, weights, workers=2)
    assert _fake_conversions(names, held, 0, held_bytes=lambda: 200 * MIB)[1] == 1
    assert held.rows[1].waited_for_memory


def test_measured_peaks_refine_the_rest_of_the_family():
    names = ["tflite_float32", "tflite_float16", "tflite_int8"]
    plan = MemoryPlan(Budget(64 * 2**30, "test"), 0, 10 * MIB, workers=1)
    first_prediction = None

    def convert(i):
        nonlocal first_prediction
        first_prediction = first_prediction or plan.rows[0].predicted_bytes
        return 4 * plan.rows[i].predicted_bytes  # every conversion takes 4x its prediction

    run_within_budget(names, convert, plan, lambda peak: peak)
    assert plan.rows[1].predicted_bytes > 3 * (plan.rows[0].measured_bytes / 4)  # scaled by what was measured
    record = plan.to_json()
    assert record["rows"][0]["measured_bytes"] == 4 * first_prediction
    assert record["budget_bytes"] == 64 * 2**30 and record["children_peak_together_bytes"] > 0


@pytest.mark.slow
def test_lean_tf2onnx_writes_plain_tf2onnx_bytes(tmp_path: Path):
    import keras
    import numpy as np

    inputs = keras.Input((16, 16, 3), name="image")
    x = keras.layers.Conv2D(8, 3)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation("relu")(x)
    outputs = keras.layers.Dense(4, activation="softmax", name="scores")(keras.layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inputs, outputs)
    model.layers[2].set_weights([np.full(8, 1.5, np.float32), np.full(8, 0.1, np.float32),
                                 np.full(8, 0.2, np.float32), np.full(8, 2.0, np.float32)])
    model.export(str(tmp_path / "sm"), verbose=False)
    common = ["--saved-model", str(tmp_path / "sm"), "--tag", "serve", "--signature_def", "serving_default",
              "--opset", "17", "--output"]
    for module, name in (("tf2onnx.convert", "plain.onnx"), ("tfship.onnx_format.tf2onnx_lean", "lean.onnx")):
        subprocess.run([sys.executable, "-m", module, *common, str(tmp_path / name)], check=True,
                       capture_output=True, timeout=300)
    assert (tmp_path / "lean.onnx").read_bytes() == (tmp_path / "plain.onnx").read_bytes()

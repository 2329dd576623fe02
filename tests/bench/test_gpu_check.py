"""`make gpu-check` on a machine without a GPU: the GPU parts say why they were skipped, the JSON and the table
have the tested shape, a failing part is recorded without stopping the others, and ONNX Runtime's provider
choice is what is asked for and what the session reads back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from bench.gpu_check import probe
from bench.gpu_check.parts import Context, Skip, run_part
from bench.gpu_check.report import SCHEMA, PartResult, PartStatus, document, markdown
from tfship.serving.runtimes import REGISTRY, RuntimeOptions
from tfship.serving.runtimes.onnx import choose_providers

ROOT = Path(__file__).resolve().parents[2]


def test_without_a_gpu_each_gpu_part_is_skipped_with_its_reason(tmp_path: Path) -> None:
    if probe.gpus():
        import pytest

        pytest.skip("this machine has a GPU: run `make gpu-check` itself")
    parts = "serving,multi_model,publish,cloud_image"
    done = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--quick", "--parts", parts, "--out",
                           str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads((tmp_path / "gpu-check-latest.json").read_text())
    assert doc["schema"] == SCHEMA and doc["machine"]["gpus"] == "none"
    assert [(p["name"], p["status"]) for p in doc["parts"]] == [(name, "skipped") for name in parts.split(",")]
    assert all("no NVIDIA GPU" in p["reason"] for p in doc["parts"])
    table = (tmp_path / "gpu-check-latest.md").read_text()
    assert "| serving | skipped | 0.0 | no NVIDIA GPU (nvidia-smi lists none): GPU serving needs one |" in table


def test_a_failing_part_is_recorded_and_a_spent_budget_skips(tmp_path: Path) -> None:
    ctx = Context(work=tmp_path, gpus=[], deadline=float("inf"))

    def broken(_ctx: Context) -> PartResult:
        raise RuntimeError("loadgen exited 1: connection refused\nsecond line")

    def cannot(_ctx: Context) -> PartResult:
        raise Skip("needs 3 cores")

    failed, skipped = run_part("serving", broken, ctx), run_part("scaling", cannot, ctx)
    assert (failed.status, failed.reason) == (PartStatus.FAILED, "RuntimeError: loadgen exited 1: connection refused")
    assert (skipped.status, skipped.reason) == (PartStatus.SKIPPED, "needs 3 cores")
    late = run_part("training", broken, Context(work=tmp_path, gpus=[], deadline=0.0))
    assert late.status is PartStatus.SKIPPED and "time budget" in late.reason


def test_markdown_table_keeps_cells_on_one_line() -> None:
    parts = [PartResult("training", PartStatus.RAN, seconds=3.0,
                        rows=[{"device": "cpu", "precision": "float32", "steps_per_s": 812.25}]),
             PartResult("cloud_image", PartStatus.SKIPPED, "no docker | engine\nanswers")]
    doc = document(parts, {"gpus": "none", "cpu_cores": 2}, started=0.0)
    text = markdown(doc)
    assert "| cloud_image | skipped | 0.0 | no docker / engine answers |" in text
    assert "| device | precision | steps_per_s |" in text and "| cpu | float32 | 812.2 |" in text
    assert json.loads(json.dumps(doc))["parts"][0]["rows"][0]["steps_per_s"] == 812.25


def test_provider_choice_and_read_back(tmp_path: Path) -> None:
    assert choose_providers(True, ["CUDAExecutionProvider", "CPUExecutionProvider"]) == [
        "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert choose_providers(False, ["CUDAExecutionProvider", "CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    assert choose_providers(True, ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])])
    version = tmp_path / "1"
    version.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), version / "model.onnx")
    runtime = REGISTRY.create("onnx", version, RuntimeOptions(use_gpu=True))
    runtime.load()
    expected = "CUDAExecutionProvider" if "CUDAExecutionProvider" in probe.onnx_providers() else "CPUExecutionProvider"
    assert runtime.providers[0] == expected
    np.testing.assert_array_equal(runtime.predict({"x": np.array([[-1.0, 2.0]], np.float32)})["y"], [[0.0, 2.0]])


def test_an_image_without_tensorflow_skips_the_tensorflow_parts_and_uses_a_prebuilt_onnx(
        tmp_path: Path, monkeypatch) -> None:
    """A GPU machine whose image has no TensorFlow (no wheel can be installed there): the TensorFlow parts are
    skipped naming it, serving leaves out the backends that cannot use the GPU and says why, and the models come
    from `bench.gpu_check.prebuild`'s folder, or the part says how to make one."""
    import importlib.util

    from bench.gpu_check import parts

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorflow" else real_find_spec(name, *a))
    monkeypatch.setattr(probe, "onnx_providers", lambda: ["CPUExecutionProvider"])
    gpu = probe.Gpu(index=0, name="test GPU", memory_total_mib=1024, driver="0")
    ctx = Context(work=tmp_path, gpus=[gpu], deadline=float("inf"))
    for name in ("training", "publish", "multi_model", "training_loop"):
        result = run_part(name, parts.PARTS[name], ctx)
        assert result.status is PartStatus.SKIPPED and "TensorFlow is not installed" in result.reason, result
    serving = run_part("serving", parts.PARTS["serving"], ctx)
    assert serving.status is PartStatus.SKIPPED
    assert "saved_model: TensorFlow is not installed" in serving.reason
    assert "onnx: ONNX Runtime offers no CUDAExecutionProvider (CPUExecutionProvider)" in serving.reason
    try:
        parts._models(ctx, with_resnet=False)
        raise AssertionError("no prebuilt model, no TensorFlow: _models must skip")
    except Skip as why:
        assert "bench.gpu_check.prebuild" in str(why)
    onnx_file = tmp_path / "repo" / "mlp" / "1" / "model.onnx"
    onnx_file.parent.mkdir(parents=True)
    onnx_file.write_bytes(b"prebuilt")
    assert parts._models(ctx, with_resnet=False) == {"mlp": ("x", (784,))}

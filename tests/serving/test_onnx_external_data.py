"""An ONNX file whose tensors keep their values in another file (`external_data`) is served only when that file is
inside the version folder: an absolute path, `..` or a link is refused before ONNX Runtime opens anything
(`serving.runtimes.onnx_files`); weights beside the model still load."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tfship.serving.runtimes.base import RuntimeLoadError
from tfship.serving.runtimes.onnx import OnnxRuntime
from tfship.serving.runtimes.onnx_files import external_data_problems

W = np.arange(256, dtype=np.float32)


def _model(version_dir: Path, location: str | None = "weights.bin") -> Path:
    """`y = x + w` with `w` (256 floats) in `weights.bin` beside `model.onnx`, then its location set to `location`;
    inside a subgraph too (an `If` branch), so the walk must reach nested graphs."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    version_dir.mkdir(parents=True)
    weight = numpy_helper.from_array(W, "w")
    branch = helper.make_graph([helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(W, "c"))],
                               "branch", [], [helper.make_tensor_value_info("c", TensorProto.FLOAT, [256])])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["s"]),
         helper.make_node("Constant", [], ["yes"], value=helper.make_tensor("yes", TensorProto.BOOL, [], [True])),
         helper.make_node("If", ["yes"], ["b"], then_branch=branch, else_branch=branch),
         helper.make_node("Add", ["s", "b"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 256])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(version_dir / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0, convert_attribute=True)
    if location != "weights.bin":
        from onnx.external_data_helper import _get_all_tensors

        saved = onnx.load(str(version_dir / "model.onnx"), load_external_data=False)
        for tensor in _get_all_tensors(saved):  # the initializer and the If branches' constants
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = location
        onnx.save_model(saved, str(version_dir / "model.onnx"))
    return version_dir


def test_weights_beside_the_model_are_served(tmp_path):
    version = _model(tmp_path / "1")
    assert external_data_problems(version / "model.onnx") == []
    runtime = OnnxRuntime(version)
    runtime.load()
    x = np.ones((2, 256), np.float32)
    np.testing.assert_array_equal(runtime.predict({"x": x})["y"], x + 2 * W)


@pytest.mark.parametrize(("location", "why"), [("/etc/hostname", "an absolute or empty path"),
                                               ("../outside.bin", "a path leaving the version folder"),
                                               ("sub/../../outside.bin", "a path leaving the version folder"),
                                               ("linked.bin", "a link")])
def test_external_data_outside_the_version_is_refused_before_onnx_runtime_opens_it(tmp_path, location, why):
    version = _model(tmp_path / "1", location)
    (tmp_path / "outside.bin").write_bytes(W.tobytes())
    os.symlink(tmp_path / "outside.bin", version / "linked.bin")
    problems = external_data_problems(version / "model.onnx")
    assert len(problems) == 3 and all(f"keeps its values in {location!r}, {why}" in p for p in problems), problems
    assert sorted(p.split("'")[1] for p in problems) == ["c", "c", "w"]  # both If branches' constant, the initializer
    with pytest.raises(RuntimeLoadError, match=rf"refused .*model\.onnx: tensor '[cw]' keeps its values in .*{why}.*"
                                               r"\(\+1 more\)"):
        OnnxRuntime(version).load()


def test_a_file_that_is_not_protobuf_is_refused_naming_it(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.onnx").write_bytes(b"\x0a\xff\xff\xff\xff\x0fnot a model")
    with pytest.raises(RuntimeLoadError, match=r"model\.onnx: not an ONNX file"):
        OnnxRuntime(tmp_path / "1").load()

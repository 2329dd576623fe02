"""Models past the 2 GiB file limit of protobuf (ONNX), decided before converting.

A protobuf message cannot be serialised past 2 GiB (2^31 - 1 bytes), so an ONNX file holding a larger
model's weights inline cannot exist: tf2onnx's large-model path (`--large_model`) keeps the weights as
external tensors, which `repack_external_data` turns into TF Serving-style `model.onnx` + one
`model.onnx.data` file (ONNX's external-data format; ONNX Runtime and `onnx.checker` load it by path).
(A TFLite FlatBuffer has the same 2 GiB limit and no external-data form: `tflite.size_limit` refuses such a
model by name before its converter starts.) The limit is `convert.size_limit_bytes`, lowered in tests to
exercise both paths with small models.
"""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

from tfship.core.saved_model import saved_model_weight_bytes


def onnx_needs_external_data(saved_model_dir: Path, limit_bytes: int) -> bool:
    """True when the weights alone would put an inline ONNX file past `limit_bytes`."""
    return saved_model_weight_bytes(saved_model_dir) > limit_bytes


def repack_external_data(archive: Path, output: Path) -> list[Path]:
    """tf2onnx's `--large_model` zip -> `output` (graph) + `<output>.data` (every weight, one file).

    The archive holds `__MODEL_PROTO.onnx` and one file per tensor; they are unpacked into a folder beside
    `output`, loaded (one copy of the weights in memory), saved again with all tensors in `<output name>.data`
    (the location recorded in the graph is that bare file name, so the pair can be renamed together), and the
    folder is removed. Returns [output, data file]; both are written under their final names.
    """
    import onnx

    unpacked = output.with_name(f".{output.name}.unpacked")
    shutil.rmtree(unpacked, ignore_errors=True)
    try:
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(unpacked)
        model = onnx.load(str(unpacked / "__MODEL_PROTO.onnx"), load_external_data=True)
        data = output.with_name(output.name + ".data")
        data.unlink(missing_ok=True)
        onnx.save_model(model, str(output), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data.name, size_threshold=1024)
        del model
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)
    return [output, data]


def has_external_data(path: Path) -> bool:
    """Whether `path`'s ONNX graph keeps any tensor in an external file (read without loading weights)."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(path), load_external_data=False)
    return any(uses_external_data(t) for t in model.graph.initializer)


__all__ = ["has_external_data", "onnx_needs_external_data", "repack_external_data"]

"""The ONNX format for the conversion registry (`pipeline.conversion.registry`): one `ArtifactFormat`, `onnx`.

`model.onnx` holds `serving_default`; each other signature is its own `model.<signature>.onnx`
(`onnx_format.signatures`); weights past `convert.size_limit_bytes` go to `model.onnx.data`
(`onnx_format.large_models`). Enabled by `convert.onnx`, judged as float32, served by the `onnx` backend
(ONNX Runtime).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfship.core.contract import DEFAULT_SIGNATURE
from tfship.core.errors import TfshipError
from tfship.core.formats import MIB, ArtifactFormat, ConversionJob, PeakModel, ToleranceFamily, VariantOutcome
from tfship.core.statuses import ConversionStatus
from tfship.serving.runtimes.onnx import OnnxRuntime, signature_files

FILENAME = OnnxRuntime.FILE  # model.onnx: the file the `onnx` backend serves as serving_default


def convert_onnx(job: ConversionJob) -> VariantOutcome:
    """tf2onnx's SavedModel route in a child process, checked (`onnx_format.convert`): `serving_default` into
    `model.onnx`, then each other signature into its own `model.<signature>.onnx` (`onnx_format.signatures`;
    `signature_files`, and `signatures_left_out` with the reasons). Never raises for a refused conversion.
    """
    from tfship.onnx_format.convert import convert_to_onnx
    from tfship.onnx_format.signatures import convert_other_signatures

    path, settings = job.version_dir / FILENAME, job.settings
    try:
        done = convert_to_onnx(job.version_dir, path, job.contract, settings.onnx_opset, job.sample,
                               settings.timeout_seconds, settings.onnx_simplify, settings.size_limit_bytes)
    except TfshipError as err:
        return VariantOutcome(ONNX.name, ConversionStatus.REFUSED, str(err))
    others = convert_other_signatures(job.version_dir, settings.onnx_opset, job.sample, settings.timeout_seconds,
                                      settings.onnx_simplify, settings.size_limit_bytes)
    size = done.size_bytes + sum((job.version_dir / name).stat().st_size for name in others.written.values())
    return VariantOutcome(ONNX.name, ConversionStatus.PRODUCED, "", str(path), size,
                          round(done.seconds + others.seconds, 2), done.reproduce_command,
                          peak_memory_bytes=max(done.peak_rss_bytes, others.peak_rss_bytes),
                          signature_files=others.written, signatures_left_out=others.left_out)


def onnx_signature_files(path: Path) -> dict[str, str]:
    """{signature: file name} of the ONNX signature files beside `path` (`serving.runtimes.onnx.signature_files`)."""
    return {name: file.name for name, file in sorted(signature_files(Path(path).parent).items())}


def describe_onnx_file(path: Path) -> dict[str, Any]:
    """`tfship inspect`'s view of an `.onnx` file: its opsets and its graph's inputs and outputs (name, numpy dtype,
    shape with -1 for dynamic dimensions) as `serving_default`. Weights are not loaded.
    """
    import onnx  # the pipeline extra's, not in the TensorFlow-free install

    model = onnx.load(str(path), load_external_data=False)

    def spec(value) -> dict[str, Any]:
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
        return {"name": value.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name,
                "shape": dims}

    return {"format": "onnx", "path": str(path),
            "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
            "signatures": {DEFAULT_SIGNATURE: {"inputs": [spec(v) for v in model.graph.input],
                                               "outputs": [spec(v) for v in model.graph.output]}}}


ONNX = ArtifactFormat(
    "onnx", package="onnx", backend="onnx", family=ToleranceFamily.FLOAT32, filename=FILENAME, enable_key="onnx",
    convert=convert_onnx,
    # Fitted on measured child peaks (ResNet50 as exported: 104 MB of weights; docs/benchmarks.md), rounded up.
    peak=PeakModel(900 * MIB, 15.0),
    # external weights past 2 GiB; the other signatures' files and theirs
    companions=(f"{FILENAME}.data", "model.*.onnx", "model.*.onnx.data"),
    signature_files=onnx_signature_files, separate_signature_files=True, describe=describe_onnx_file)
FORMATS = (ONNX,)

__all__ = ["FORMATS", "ONNX", "convert_onnx", "describe_onnx_file", "onnx_signature_files"]

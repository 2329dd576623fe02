"""The four TFLite formats for the conversion registry (`pipeline.conversion.registry`): `tflite_float32`,
`tflite_float16`, `tflite_dynamic_range`, `tflite_int8`.

Each is one `ArtifactFormat`: enabled when `convert.tflite_modes` lists its mode, converted by
`tflite.convert.convert_tflite` (child processes), judged by the tolerance family of the same name, served by the
`tflite` backend (LiteRT) with `--tflite-file` naming its file (`model.tflite` for float32, the file a TFLite
server picks by default; `model_<mode>.tflite` otherwise). A file answers the SignatureDefs it holds
(`tflite.inspect.signature_keys`).

Recipes for recurrent layers: the SavedModel as exported (`default`), else, when the converter cannot lower
their TensorList ops, the unrolled copy the export stage wrote (`unrolled`, `signatures.recurrent`).
"""

from __future__ import annotations

from pathlib import Path

from tfship.core.formats import (
    MIB,
    ArtifactFormat,
    ConversionJob,
    PeakModel,
    ToleranceFamily,
    VariantOutcome,
    one_signature,
)
from tfship.core.statuses import ConversionStatus
from tfship.serving.runtimes.base import RuntimeOptions
from tfship.tflite.modes import TFLITE_MODES, TfliteMode

# What the converter's error says when it cannot lower a recurrent layer's TensorList ops to builtins.
TENSOR_LIST_FAILURE = "tensor list"
FUSED_LSTM_NOTE = ("TFLite's fused-LSTM path needs TF2 Keras' experimental_implements LSTM annotation, which "
                   "Keras 3 layers do not carry")
# Peak memory of the converter children per mode, fitted on measured peaks (ResNet50 as exported by the pipeline:
# 104 MB of SavedModel weights; docs/benchmarks.md), rounded up.
PEAKS = {
    TfliteMode.FLOAT32: PeakModel(900 * MIB, 6.0),
    TfliteMode.FLOAT16: PeakModel(900 * MIB, 32.0),  # its peak varies run to run: 2.6 and 4.1 GB on ResNet50
    TfliteMode.DYNAMIC_RANGE: PeakModel(900 * MIB, 5.0),
    TfliteMode.INT8: PeakModel(900 * MIB, 8.0),
}


# The file the `tflite` backend serves when no `--tflite-file` names another (`model.tflite`): float32's.
DEFAULT_FILE = RuntimeOptions().tflite_file


def tflite_filename(mode: str) -> str:
    """`model.tflite` for float32 (the file servers pick by default), `model_<mode>.tflite` otherwise."""
    stem, suffix = DEFAULT_FILE.rsplit(".", 1)
    return DEFAULT_FILE if TfliteMode(mode) is TfliteMode.FLOAT32 else f"{stem}_{TfliteMode(mode).value}.{suffix}"


def tflite_signature_files(path: Path) -> dict[str, str]:
    """{signature: file name} for the SignatureDefs the `.tflite` file at `path` holds."""
    from tfship.tflite.inspect import signature_keys

    path = Path(path)
    return {name: path.name for name in sorted(signature_keys(path.read_bytes()))} if path.is_file() \
        else one_signature(path)


def describe_tflite_file(path: Path) -> dict:
    """`tfship inspect`'s view of a `.tflite` file: its SignatureDefs' tensors (name, dtype, shape signature with
    -1 for dynamic dimensions, quantization), plus `tflite.inspect.describe_tflite`'s other fields.
    """
    from tfship.tflite.inspect import describe_tflite

    info = describe_tflite(path)
    info["signatures"] = {
        key: {side: [{"name": name, "dtype": t["dtype"], "shape": t["shape_signature"],
                      "quantization": t["quantization"]} for name, t in signature[side].items()]
              for side in ("inputs", "outputs")}
        for key, signature in info["signatures"].items()}
    return {"format": "tflite"} | info


def tflite_converter(mode: str):
    """The converter of one TFLite mode (`tflite.convert.convert_tflite`, child processes), with the recipes
    for recurrent layers: the SavedModel as exported (`default`), else its unrolled copy (`unrolled`).
    """

    def convert(job: ConversionJob) -> VariantOutcome:
        from tfship.tflite.convert import convert_tflite
        from tfship.tflite.modes import TfliteOptions
        from tfship.tflite.size_limit import tflite_refusal

        settings, name = job.settings, f"tflite_{mode}"
        options = TfliteOptions(mode=TfliteMode(mode), representative_samples=settings.representative_samples,
                                allow_flex=settings.allow_flex)
        path = job.version_dir / tflite_filename(mode)
        refusal = tflite_refusal(job.version_dir, settings.size_limit_bytes)  # before any converter process starts
        if refusal:
            return VariantOutcome(name, ConversionStatus.REFUSED, refusal)
        done = convert_tflite(job.version_dir, path, options, job.calibration, settings.timeout_seconds)
        recipe, reason, peak = "default", done.reason, done.peak_rss_bytes
        if done.status == ConversionStatus.REFUSED and (TENSOR_LIST_FAILURE in done.reason.lower()
                                                         or "flextensorlist" in done.reason.lower()):
            flex = " with SELECT_TF_OPS (convert.allow_flex)" if settings.allow_flex else ""
            tried = [f"recipe 'default' (dynamic batch){flex}: {done.reason}"]
            unrolled = job.tflite_sources.get("unrolled")
            if unrolled:
                done = convert_tflite(Path(unrolled), path, options, job.calibration, settings.timeout_seconds)
                recipe, peak = "unrolled", max(peak, done.peak_rss_bytes)
                tried.append(f"recipe 'unrolled' (recurrent layers with unroll=True): {done.reason or 'produced'}")
            else:
                tried.append("recipe 'unrolled' not available: " + (job.tflite_sources.get("unrolled_reason")
                                                                     or "the model has no Keras recurrent layer"))
            tried.append(FUSED_LSTM_NOTE)
            reason = "" if done.status == ConversionStatus.PRODUCED else "; ".join(tried)
        return VariantOutcome(name, done.status, reason, str(done.path or ""), done.size_bytes,
                              round(done.seconds, 2), done.reproduce_command, recipe, peak_memory_bytes=peak,
                              signatures_left_out=done.signatures_left_out, warnings=tuple(done.warnings))

    return convert


def tflite_format(mode: str) -> ArtifactFormat:
    """The `ArtifactFormat` of one TFLite mode (`tflite.modes.TFLITE_MODES`)."""
    filename = tflite_filename(mode)
    return ArtifactFormat(
        f"tflite_{mode}", package="tflite", backend="tflite", family=ToleranceFamily(mode), filename=filename,
        enable_key="tflite_modes", enable_value=mode, convert=tflite_converter(mode), peak=PEAKS[TfliteMode(mode)],
        file_option="tflite_file", serve_flags=("--tflite-file", filename),
        signature_files=tflite_signature_files, describe=describe_tflite_file, warm_child=True)


FORMATS = tuple(tflite_format(mode) for mode in TFLITE_MODES)

__all__ = ["FORMATS", "FUSED_LSTM_NOTE", "TENSOR_LIST_FAILURE", "tflite_converter", "tflite_filename",
           "tflite_format", "tflite_signature_files", "describe_tflite_file"]

"""The built-in artifact kinds, registered once: ONNX (tf2onnx), the four TFLite modes (LiteRT) and the
three TF.js modes (a graph-model folder, proven in Node.js; `pipeline.conversion.tfjs_kinds`).

To add an artifact kind (e.g. TF.js), write its converter (`ConversionJob -> VariantOutcome`) and add
one `register_artifact_kind(ArtifactKind(...))` call here; the convert stage, the parity gate, the
serve-check (when it has a serving backend), `convert.required`, the reports and the manifest pick it up.
"""

from __future__ import annotations

from pathlib import Path

from tfship.core.errors import TfshipError
from tfship.pipeline.conversion.artifacts import (
    ArtifactKind,
    ConversionJob,
    ConversionStatus,
    VariantOutcome,
    register_artifact_kind,
)
from tfship.pipeline.conversion.tfjs_kinds import register_tfjs_kinds
from tfship.tflite.modes import TFLITE_MODES

__all__ = ["TFLITE_MODES", "convert_onnx", "tflite_converter", "tflite_filename"]


def tflite_filename(mode: str) -> str:
    """`model.tflite` for float32 (the file servers pick by default), `model_<mode>.tflite` otherwise."""
    return "model.tflite" if mode == "float32" else f"model_{mode}.tflite"


def convert_onnx(job: ConversionJob) -> VariantOutcome:
    """tf2onnx's SavedModel route in a child process, checked (`pipeline.conversion.onnx_convert`):
    `serving_default` into `model.onnx`, then each other signature into its own `model.<signature>.onnx`
    (`pipeline.conversion.onnx_signatures`; `signature_files`, and `signatures_left_out` with the reasons).
    """
    from tfship.pipeline.conversion.onnx_convert import convert_to_onnx
    from tfship.pipeline.conversion.onnx_signatures import convert_other_signatures

    path, settings = job.version_dir / "model.onnx", job.settings
    try:
        done = convert_to_onnx(job.version_dir, path, job.contract, settings.onnx_opset, job.sample,
                               settings.timeout_seconds, settings.onnx_simplify, settings.size_limit_bytes)
    except TfshipError as err:
        return VariantOutcome("onnx", ConversionStatus.REFUSED, str(err))
    others = convert_other_signatures(job.version_dir, settings.onnx_opset, job.sample, settings.timeout_seconds,
                                      settings.onnx_simplify, settings.size_limit_bytes)
    size = done.size_bytes + sum((job.version_dir / name).stat().st_size for name in others.written.values())
    return VariantOutcome("onnx", ConversionStatus.PRODUCED, "", str(path), size,
                          round(done.seconds + others.seconds, 2), done.reproduce_command,
                          peak_memory_bytes=max(done.peak_rss_bytes, others.peak_rss_bytes),
                          signature_files=others.written, signatures_left_out=others.left_out)


def tflite_converter(mode: str):
    """The converter of one TFLite mode (`tflite.convert.convert_tflite`, child processes), with the recipes
    for recurrent layers: the SavedModel as exported (`default`), else its unrolled copy (`unrolled`).
    """

    def convert(job: ConversionJob) -> VariantOutcome:
        from tfship.pipeline.conversion.large_models import tflite_refusal
        from tfship.signatures.recurrent import FUSED_LSTM_NOTE, TENSOR_LIST_FAILURE
        from tfship.tflite.convert import convert_tflite
        from tfship.tflite.modes import TfliteMode, TfliteOptions

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


register_artifact_kind(ArtifactKind("onnx", "onnx", "float32", "model.onnx", lambda settings: True, convert_onnx,
                                    # external weights past 2 GiB; the other signatures' files and theirs
                                    companions=("model.onnx.data", "model.*.onnx", "model.*.onnx.data")))
for _mode in TFLITE_MODES:
    register_artifact_kind(ArtifactKind(
        f"tflite_{_mode}", "tflite", _mode, tflite_filename(_mode),
        enabled=lambda settings, mode=_mode: mode in settings.tflite_modes, convert=tflite_converter(_mode),
        runtime_options={"tflite_file": tflite_filename(_mode)},
        serve_flags=("--tflite-file", tflite_filename(_mode))))
register_tfjs_kinds(register_artifact_kind, ArtifactKind)

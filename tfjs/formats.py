"""The three TF.js formats for the conversion registry (`pipeline.conversion.registry`): `tfjs`, `tfjs_float16`,
`tfjs_uint8`.

Each is one `ArtifactFormat`: enabled when `convert.tfjs_modes` lists its quantization, converted by
`tfjs.convert.convert_tfjs` into a folder of the version (`tfjs/`: model.json + weight shards), judged by the
tolerance family of its weights (float32, float16; uint8 weights like dynamic_range) and run by
`tfjs.node_runner.NodeGraphModelRunner` (Node.js, CPU backend). No tfship server backend serves it, so the
serve-check skips it; it is published as static files beside the others.
"""

from __future__ import annotations

from tfship.core.formats import ArtifactFormat, ConversionJob, ToleranceFamily, VariantOutcome
from tfship.tfjs.convert import TfjsQuantization

ONE_SIGNATURE = "a TF.js graph model holds one signature (serving_default)"


def tfjs_converter(quantization: TfjsQuantization):
    """The converter of one TF.js mode: `ConversionJob -> VariantOutcome`."""

    def convert(job: ConversionJob) -> VariantOutcome:
        from tfship.tfjs.convert import convert_tfjs

        done = convert_tfjs(job.version_dir, job.version_dir / quantization.folder, quantization, job.sample,
                            job.contract.output_names(), job.settings.timeout_seconds)
        return VariantOutcome(quantization.folder, done.status, done.reason, str(done.path or ""), done.size_bytes,
                              round(done.seconds, 2), done.reproduce_command)

    return convert


def open_node_runner(path):
    """A runner for a TF.js folder: a Node.js child that is stopped when the runner is closed."""
    from tfship.tfjs.node_runner import NodeGraphModelRunner

    return NodeGraphModelRunner(path)


def tfjs_format(quantization: TfjsQuantization) -> ArtifactFormat:
    """The `ArtifactFormat` of one TF.js quantization (its folder is its name: `tfjs`, `tfjs_float16`, ...)."""
    return ArtifactFormat(
        quantization.folder, package="tfjs", backend="", family=ToleranceFamily(quantization.parity_mode),
        filename=quantization.folder, enable_key="tfjs_modes", enable_value=quantization.value,
        convert=tfjs_converter(quantization), runner=open_node_runner, one_signature_reason=ONE_SIGNATURE)


FORMATS = tuple(tfjs_format(quantization) for quantization in TfjsQuantization)

__all__ = ["FORMATS", "open_node_runner", "tfjs_converter", "tfjs_format"]

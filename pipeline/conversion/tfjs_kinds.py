"""The TF.js artifact kinds (`tfjs`, `tfjs_float16`, `tfjs_uint8`) for the artifact registry.

Each is one `ArtifactKind` (`pipeline.conversion.artifacts`): enabled by `convert.tfjs_modes`, converted by
`tfjs.convert.convert_tfjs` into a folder of the version (`tfjs/`: model.json + weight shards), judged by
the parity gate with its quantization's tolerance family (float32, float16; uint8 weights like
dynamic_range) and run by `tfjs.node_runner.NodeGraphModelRunner` (Node.js, CPU backend). No tfship server
backend serves it, so the serve-check skips it; it is published as static files beside the others.
"""

from __future__ import annotations

from tfship.pipeline.conversion.artifacts import VariantOutcome
from tfship.tfjs.convert import TfjsQuantization


def tfjs_converter(quantization: TfjsQuantization):
    """The converter of one TF.js mode: `ConversionJob -> VariantOutcome`."""

    def convert(job):
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


def register_tfjs_kinds(register, kind_class) -> None:
    """Register the three TF.js kinds with `register(kind_class(...))` (the registry's own functions)."""
    for quantization in TfjsQuantization:
        register(kind_class(
            quantization.folder, "", quantization.parity_mode, quantization.folder,
            enabled=lambda settings, mode=quantization.value: mode in settings.tfjs_modes,
            convert=tfjs_converter(quantization), runner=open_node_runner))

"""ONNX files for a SavedModel's other signatures: one file each, beside `model.onnx`.

An ONNX file holds one graph, so each signature besides `serving_default` (e.g. `score` of a `tf.Module` saved
with two) is converted on its own by the same route as `model.onnx` (`onnx_format.convert.convert_to_onnx`: tf2onnx's
`--signature_def <name>` in a child process, the same checks, its own reproduce script) into
`model.<signature>.onnx` (`serving.runtimes.onnx.signature_file_name`, e.g. `model.score.onnx`), which the
`onnx` serving backend serves under that signature name. A signature that cannot be converted or checked is
left out of the ONNX artifact with its reason, without affecting `model.onnx` or the other signatures; the
parity gate then judges each file against the SavedModel's same signature (`pipeline.gate.signatures`) and
sets aside the ones that miss.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tfship.core.contract import DEFAULT_SIGNATURE
from tfship.core.errors import TfshipError
from tfship.core.saved_model import read_signatures
from tfship.onnx_format.convert import convert_to_onnx
from tfship.serving.runtimes.onnx import signature_file_name


@dataclass(frozen=True)
class SignatureFiles:
    """The other signatures' ONNX files: {signature: file name} written and checked, {signature: why not}, the
    largest converter peak (bytes) and the seconds all of them took.
    """

    written: dict[str, str] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    peak_rss_bytes: int = 0
    seconds: float = 0.0


def convert_other_signatures(version_dir: Path, opset: int, sample: dict[str, np.ndarray], timeout_s: float,
                             simplify: bool = False, size_limit_bytes: int = 2**31 - 1) -> SignatureFiles:
    """Convert every signature of `version_dir`'s SavedModel besides `serving_default` to its own ONNX file.

    Args:
        version_dir: the version folder holding the SavedModel; the files are written beside it.
        opset, simplify, size_limit_bytes: as `onnx_format.convert.convert_to_onnx`.
        sample: one real batch by input name ({name: [B, ...]}); each file is run on the arrays its
            signature takes, and a signature whose inputs it lacks is not converted (nothing could check it).
        timeout_s: seconds for each signature's conversion.

    Returns:
        What was written and why the others were not; never raises for a signature that fails.
    """
    started = time.perf_counter()
    written, left_out, peak = {}, {}, 0
    signatures = read_signatures(Path(version_dir))
    for name in sorted(n for n in signatures if n != DEFAULT_SIGNATURE):
        filename = signature_file_name(name)
        if filename is None:
            left_out[name] = (f"signature {name!r} cannot name a file (model.<signature>.onnx takes letters, "
                              "digits, '_', '-' and '.'); rename the signature to publish it as ONNX")
            continue
        missing = [n for n in signatures[name].input_names() if n not in sample]
        if missing:
            left_out[name] = (f"not converted: the data holds no array for input(s) {missing} to check it with; "
                              f"it has {sorted(sample)}")
            continue
        feed = {n: sample[n] for n in signatures[name].input_names()}
        try:
            done = convert_to_onnx(Path(version_dir), Path(version_dir) / filename, signatures[name], opset, feed,
                                   timeout_s, simplify, size_limit_bytes)
        except TfshipError as err:
            left_out[name] = str(err)
            continue
        written[name], peak = filename, max(peak, done.peak_rss_bytes)
    return SignatureFiles(written, left_out, peak, time.perf_counter() - started)

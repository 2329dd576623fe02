"""A version's other signatures: which artifact carries which, and each carrier's answers on each one.

A SavedModel carries every signature (TF Serving serves them all); a TFLite file carries the ones its
converter wrote (`tflite.worker.carried_signatures`: all but int8's); ONNX and TF.js files carry
`serving_default` alone. The parity gate judges `serving_default` (`pipeline.gate.validate`); this judges
every other signature a converted artifact carries against the SavedModel's same signature, on the same
held-out inputs (by name), at every configured batch size, with the artifact's mode's tolerance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tfship.core.contract import DEFAULT_SIGNATURE, Signature
from tfship.core.saved_model import read_signatures
from tfship.pipeline.config import ValidateSection
from tfship.pipeline.conversion.artifacts import Artifact, RuntimeRunner, artifact_kinds
from tfship.pipeline.gate.compare import compare_outputs, failures


def carried_signatures(artifact: Artifact) -> tuple[str, ...]:
    """The signature names `artifact` answers: a SavedModel's `signature_def` keys, a TFLite file's own
    SignatureDefs, `serving_default` for any other kind.
    """
    if artifact.kind == "saved_model":
        return tuple(sorted(read_signatures(Path(artifact.path))))
    if artifact.kind == "tflite" and Path(artifact.path).is_file():
        from tfship.tflite.inspect import signature_keys

        return tuple(sorted(signature_keys(Path(artifact.path).read_bytes())))
    return (DEFAULT_SIGNATURE,)


def signature_feed(signature: Signature, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray] | None, str]:
    """(the arrays of `inputs` that `signature` takes, "") or (None, why the data cannot feed it)."""
    missing = [n for n in signature.input_names() if n not in inputs]
    if missing:
        return None, f"not checked: the data holds no array for input(s) {missing}; it has {sorted(inputs)}"
    return {n: inputs[n] for n in signature.input_names()}, ""


def runner_for(artifact: Artifact, signature_name: str) -> RuntimeRunner:
    """The serving runtime of `artifact` bound to `signature_name` (raises `RuntimeLoadError`)."""
    kind = artifact_kinds().get(artifact.name)
    return RuntimeRunner(artifact, kind.runtime_options if kind else None, signature_name=signature_name)


def _batched(runner: RuntimeRunner, feed: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
    from tfship.pipeline.gate.validate import run_batched

    return run_batched(runner, feed, batch_size)


def validate_other_signatures(reference: Artifact, candidates: list[Artifact], inputs: dict[str, np.ndarray],
                              settings: ValidateSection) -> dict[str, dict[str, dict[str, Any]]]:
    """{artifact: {signature: passed, reason, max_abs_error}} for every converted artifact carrying a signature
    besides `serving_default`, judged against the SavedModel's answers on that signature.

    A signature whose inputs the data lacks is reported `checked: false` with the reason (nothing to run).
    """
    from tfship.pipeline.gate.validate import tolerance_for

    signatures = read_signatures(Path(reference.path))
    verdicts: dict[str, dict[str, dict[str, Any]]] = {}
    expected: dict[str, dict[str, np.ndarray]] = {}
    for artifact in candidates:
        others = [s for s in carried_signatures(artifact) if s != DEFAULT_SIGNATURE and s in signatures]
        for name in others:
            feed, why = signature_feed(signatures[name], inputs)
            row: dict[str, Any] = {"checked": feed is not None, "passed": True, "reason": why, "max_abs_error": 0.0}
            if feed is not None:
                try:
                    if name not in expected:
                        expected[name] = _batched(runner_for(reference, name), feed, max(settings.batch_sizes))
                    runner = runner_for(artifact, name)
                    problems, worst = [], 0.0
                    for batch_size in settings.batch_sizes:
                        rows = compare_outputs(_batched(runner, feed, batch_size), expected[name],
                                               tolerance_for(artifact.mode, settings))
                        problems += [f"batch {batch_size}: {p}" for p in failures(rows)]
                        worst = max([worst, *(r.max_abs_error for r in rows if not r.exact)])
                    runner.close()
                    row |= {"passed": not problems, "reason": "; ".join(problems[:3]), "max_abs_error": worst}
                except Exception as err:  # noqa: BLE001 - a runtime failure is this signature's verdict
                    row |= {"passed": False, "reason": f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"}
            verdicts.setdefault(artifact.name, {})[name] = row
    return verdicts

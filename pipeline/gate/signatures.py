"""A version's other signatures: which artifact carries which, and each carrier's answers on each one.

A SavedModel carries every signature (TF Serving serves them all); a TFLite file carries the ones its
converter wrote (`tflite.worker.carried_signatures`: all but int8's); the ONNX artifact carries one file per
signature (`model.onnx` for `serving_default`, `model.<signature>.onnx` for each other one,
`onnx_format.signatures`); a TF.js graph model carries `serving_default` alone. Every signature an
artifact does not carry is named with the reason (`signature_carriage`). The parity gate judges
`serving_default` (`pipeline.gate.validate`); this judges
every other signature a converted artifact carries against the SavedModel's same signature, on the same
held-out inputs (by name), at every configured batch size, with the artifact's mode's tolerance plus
`validate.noise_multiplier` times the SavedModel's own noise on that signature (its answers between the
configured batch sizes and across a repeated call, `pipeline.gate.validate.reference_noise`), exactly as
`serving_default` is judged: a difference the SavedModel shows against itself never fails a signature either. A
signature that misses in a file of its own (ONNX) is set aside (`SET_ASIDE`, so it is neither served nor
published) and the rest of the artifact stays; one that misses inside a shared file (TFLite) leaves that artifact out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tfship.core.contract import DEFAULT_SIGNATURE, Signature
from tfship.core.formats import one_signature
from tfship.core.saved_model import read_signatures
from tfship.pipeline.config import ValidateSection
from tfship.pipeline.conversion.artifacts import SAVED_MODEL, Artifact, RuntimeRunner, SignatureCarriage, format_for
from tfship.pipeline.gate.compare import compare_outputs
from tfship.pipeline.gate.float64 import float64_outputs
from tfship.pipeline.gate.noise import ImplementationNoise, implementation_noise
from tfship.pipeline.gate.parity_report import SignatureVerdict, verdicts_to_json
from tfship.pipeline.gate.validate import ReferenceNoise, noise_hint, reference_noise, run_batched, tolerance_for

SET_ASIDE = ".signatures_left_out"  # in the version folder: signature files that missed (hidden: never published)


def signature_files(artifact: Artifact) -> dict[str, str]:
    """{signature: the file (name in the version folder) that answers it} for `artifact`: every `signature_def`
    key of the SavedModel (`saved_model.pb`), else what its format says it holds (`ArtifactFormat.signature_files`:
    a TFLite file's own SignatureDefs, each ONNX signature file present), `serving_default` alone for an
    artifact of no registered format.
    """
    path = Path(artifact.path)
    if artifact.kind == SAVED_MODEL:
        return {name: "saved_model.pb" for name in sorted(read_signatures(path))}
    spec = format_for(artifact)
    return spec.signature_files(path) if spec is not None else one_signature(path)


def signature_carriage(artifact: Artifact, signatures: list[str], conversion: dict[str, Any] | None = None,
                       verdicts: dict[str, SignatureVerdict] | None = None) -> SignatureCarriage:
    """Which of `signatures` (the SavedModel's) `artifact` carries, by file, and why it carries no other.

    Args:
        conversion: its `convert.json` row (`signatures_left_out`: the converter's reasons).
        verdicts: its verdicts on the other signatures ({signature: `SignatureVerdict`}; a set-aside file's miss).
    """
    files = signature_files(artifact)
    left_out = {}
    for name in (n for n in signatures if n not in files):
        verdict = (verdicts or {}).get(name)
        recorded = (conversion or {}).get("signatures_left_out", {}).get(name)
        if verdict is not None and verdict.set_aside:
            left_out[name] = f"parity: {verdict.reason}"
        elif recorded:
            left_out[name] = recorded
        else:
            spec = format_for(artifact)
            left_out[name] = (spec.one_signature_reason if spec is not None else "") \
                or f"the {artifact.name} file does not hold it"
    return SignatureCarriage(files, left_out)


def carried_signatures(artifact: Artifact) -> tuple[str, ...]:
    """The signature names `artifact` answers (`signature_files`), sorted."""
    return tuple(signature_files(artifact))


def _own_file(artifact: Artifact, name: str) -> Path | None:
    """The file of `artifact` that holds signature `name` alone (a format with `separate_signature_files`: ONNX's
    `model.<signature>.onnx`), else None.
    """
    spec = format_for(artifact)
    if spec is None or not spec.separate_signature_files or name == DEFAULT_SIGNATURE:
        return None
    file = signature_files(artifact).get(name)
    return Path(artifact.path).parent / file if file else None


def set_aside(path: Path) -> str:
    """Move a signature file that missed (and its external data, `<file>.data`) into `SET_ASIDE` beside it;
    returns where it went, relative to the version folder.
    """
    folder = path.parent / SET_ASIDE
    folder.mkdir(exist_ok=True)
    for part in (path, path.with_name(path.name + ".data")):
        if part.exists():
            part.replace(folder / part.name)
    return f"{SET_ASIDE}/{path.name}"


def restore_set_aside(version_dir: Path) -> None:
    """Put back every file `set_aside` moved (the gate judges them again when it runs again)."""
    folder = Path(version_dir) / SET_ASIDE
    if folder.is_dir():
        for part in folder.iterdir():
            part.replace(Path(version_dir) / part.name)
        folder.rmdir()


def signature_feed(signature: Signature, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray] | None, str]:
    """(the arrays of `inputs` that `signature` takes, "") or (None, why the data cannot feed it)."""
    missing = [n for n in signature.input_names() if n not in inputs]
    if missing:
        return None, f"not checked: the data holds no array for input(s) {missing}; it has {sorted(inputs)}"
    return {n: inputs[n] for n in signature.input_names()}, ""


def runner_for(artifact: Artifact, signature_name: str) -> RuntimeRunner:
    """The serving runtime of `artifact` bound to `signature_name` (raises `RuntimeLoadError`)."""
    return RuntimeRunner(artifact, signature_name=signature_name)


@dataclass(frozen=True)
class OtherSignatures:
    """The other signatures' verdicts and the SavedModel's own noise on each.

    verdicts: {artifact: {signature: `SignatureVerdict`}}; noise: {signature: {float
    output: `ReferenceNoise`}} (the SavedModel on that signature against itself, as
    `pipeline.gate.validate.reference_noise`); implementation: {signature: {float output:
    `ImplementationNoise`}} (the SavedModel's float32 rounding error on that signature, against float64).
    """

    verdicts: dict[str, dict[str, SignatureVerdict]]
    noise: dict[str, dict[str, ReferenceNoise]]
    implementation: dict[str, dict[str, ImplementationNoise]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """`parity.json`'s `signatures` (verdicts) and `signature_noise` ({signature: {output: noise}})."""
        return {"signatures": verdicts_to_json(self.verdicts),
                "signature_noise": {name: {output: asdict(value) for output, value in outputs.items()}
                                    for name, outputs in self.noise.items()},
                "signature_implementation_noise": {name: {output: asdict(value) for output, value in outputs.items()}
                                                   for name, outputs in self.implementation.items()}}


def _reference_answers(reference: Artifact, name: str, feed: dict[str, np.ndarray], settings: ValidateSection
                       ) -> tuple[dict[str, np.ndarray], dict[str, ReferenceNoise], dict[str, ImplementationNoise]]:
    """The SavedModel's answers on signature `name` at the largest batch size, and its own noises there: between
    the configured batch sizes and across a repeated call (`pipeline.gate.validate.reference_noise`), and its
    float32 rounding error against the signature in float64 (`pipeline.gate.noise.implementation_noise`).
    """
    runner = runner_for(reference, name)
    try:
        total = len(next(iter(feed.values())))
        sizes = sorted({min(size, total) for size in settings.batch_sizes})
        by_batch = {size: run_batched(runner, feed, size) for size in sizes}
        largest = max(by_batch)
        truth, why_not = float64_outputs(Path(reference.path), feed, largest, name)
        return (by_batch[largest], reference_noise(by_batch, run_batched(runner, feed, largest)),
                implementation_noise(by_batch[largest], truth, why_not))
    finally:
        runner.close()


def _judge(artifact: Artifact, name: str, feed: dict[str, np.ndarray], expected: dict[str, np.ndarray],
           noise: dict[str, ReferenceNoise], settings: ValidateSection,
           implementation: dict[str, ImplementationNoise] | None = None) -> SignatureVerdict:
    """One artifact's answers on signature `name` at every batch size against the SavedModel's (`expected`),
    its mode's bound plus `validate.noise_multiplier` times the SavedModel's own noise; a miss names that noise,
    the batch sizes and the setting to change.
    """
    tolerance = tolerance_for(artifact.mode, settings)
    runner = runner_for(artifact, name)
    problems, worst = [], 0.0
    try:
        for batch_size in settings.batch_sizes:
            rows = compare_outputs(run_batched(runner, feed, batch_size), expected, tolerance,
                                   noise={output: value.max_abs for output, value in noise.items()},
                                   implementation_noise={o: v.max_abs for o, v in (implementation or {}).items()})
            problems += [f"batch {batch_size}: {row.describe()}"
                         + (f"; {noise_hint(noise.get(row.output), tolerance, (implementation or {}).get(row.output))}"
                            if "outside tolerance" in row.detail else "") for row in rows if not row.passed]
            worst = max([worst, *(r.max_abs_error for r in rows if not r.exact)])
    finally:
        runner.close()
    return SignatureVerdict(True, not problems, "; ".join(problems[:3]), worst)


def validate_other_signatures(reference: Artifact, candidates: list[Artifact], inputs: dict[str, np.ndarray],
                              settings: ValidateSection) -> OtherSignatures:
    """Every converted artifact carrying a signature besides `serving_default`, judged on it against the
    SavedModel's answers, with the SavedModel's own noise on it allowed (as the parity gate allows it on
    `serving_default`); that noise is measured for every other signature the data can feed.

    A signature whose inputs the data lacks is reported `checked: false` with the reason (nothing to run). A
    signature file of its own that misses (ONNX) is moved out of the version (`set_aside`; the row's
    `set_aside` says where) and leaves the rest of its artifact in; files set aside by an earlier run of this
    gate are judged again.
    """
    signatures = read_signatures(Path(reference.path))
    restore_set_aside(Path(reference.path))
    expected: dict[str, dict[str, np.ndarray]] = {}
    noise: dict[str, dict[str, ReferenceNoise]] = {}
    implementation: dict[str, dict[str, ImplementationNoise]] = {}
    for name in sorted(signatures):
        feed, _ = signature_feed(signatures[name], inputs)
        if name != DEFAULT_SIGNATURE and feed is not None:
            expected[name], noise[name], implementation[name] = _reference_answers(reference, name, feed, settings)
    verdicts: dict[str, dict[str, SignatureVerdict]] = {}
    for artifact in candidates:
        for name in (s for s in carried_signatures(artifact) if s != DEFAULT_SIGNATURE and s in signatures):
            feed, why = signature_feed(signatures[name], inputs)
            verdict = SignatureVerdict(False, True, why or "")
            if feed is not None:
                try:
                    verdict = _judge(artifact, name, feed, expected[name], noise[name], settings, implementation[name])
                except Exception as err:  # noqa: BLE001 - a runtime failure is this signature's verdict
                    verdict = SignatureVerdict(True, False, f"{type(err).__name__}: {' '.join(str(err).split())[:300]}")
            own = _own_file(artifact, name)
            if own is not None and not verdict.passed:
                verdict = replace(verdict, set_aside=set_aside(own))  # the artifact's other files stay
            verdicts.setdefault(artifact.name, {})[name] = verdict
    return OtherSignatures(verdicts, noise, implementation)

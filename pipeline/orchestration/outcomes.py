"""Per-artifact outcomes: every converted artifact is `published` or `left out` with its reason.

The SavedModel must exist (contract read back, audit and behaviour checks passed); each converted
artifact (ONNX, each TFLite mode, any registered kind) is an outcome of its own, decided by the first stage
that refused it: `convert` (converter error naming the op, Flex needed, float16 range check,
timeout or crash with its signal), `validate` (parity miss naming the output, its error and the bound;
saturation; task metric) or `serve-check` (our server could not load it or answered differently). A left-out
artifact listed in `convert.required` fails the run instead (nothing is published).

A reason is one line naming the cause, never cut (`pipeline.orchestration.reasons.first_line`); the stage's full text
goes to `<run>/reasons/<artifact>.txt`, named in the outcome's `reason_file`.

Run status and `tfship run`'s exit code (`RunStatus`): `published` (0, every artifact published),
`partial` (3, published with optional artifacts left out), `failed` (2, nothing published).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfship.core.errors import CLI_EXIT_CODE
from tfship.pipeline.conversion.artifacts import SAVED_MODEL, ConversionStatus, SignatureCarriage, artifact_kinds
from tfship.pipeline.orchestration.reasons import first_line, write_reason_files

if TYPE_CHECKING:
    from tfship.pipeline.conversion.convert import ConvertResult
    from tfship.pipeline.gate.serve_check import ServeCheckResult
    from tfship.pipeline.gate.validate import ParityReport

PARTIAL_EXIT_CODE = 3


class OutcomeStatus(enum.StrEnum):
    """One artifact's outcome (`ArtifactOutcome.status`)."""

    PUBLISHED = "published"
    LEFT_OUT = "left out"


PUBLISHED = OutcomeStatus.PUBLISHED
LEFT_OUT = OutcomeStatus.LEFT_OUT


class RunStatus(str, enum.Enum):
    """How a run ended, with its exit code (`exit_code`)."""

    PUBLISHED = "published"
    PARTIAL = "partial"
    FAILED = "failed"

    @property
    def exit_code(self) -> int:
        """0 published, 3 partial (optional artifacts left out), 2 failed (nothing published)."""
        return {"published": 0, "partial": PARTIAL_EXIT_CODE, "failed": CLI_EXIT_CODE}[self.value]


@dataclass(frozen=True)
class ArtifactOutcome:
    """One artifact's outcome: status `published` or `left out`, the stage that decided it and why.

    reason: one line naming the cause; full_reason: the stage's whole text (not in `to_json`);
    reason_file: where the whole text was written, relative to the run folder ("" when not written).
    """

    artifact: str
    status: str
    stage: str
    reason: str
    file: str
    required: bool
    reason_file: str = ""
    full_reason: str = field(default="", repr=False)

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if key != "full_reason"}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> ArtifactOutcome:
        """Inverse of `to_json` (a row of `summary.json`'s or the manifest's `artifacts`; no full reason).

        Raises:
            KeyError, ValueError: `row` is not an outcome.
        """
        return cls(row["artifact"], OutcomeStatus(row["status"]), row["stage"], row["reason"], row["file"],
                   bool(row["required"]), row.get("reason_file", ""))


def _filename(name: str) -> str:
    kind = artifact_kinds().get(name)
    return kind.filename if kind else ""


def _served(name: str) -> bool:
    """Whether our server serves this kind (TF.js has no serving backend: parity in Node.js is its proof)."""
    kind = artifact_kinds().get(name)
    return kind is None or bool(kind.backend)


def artifact_outcomes(converted: ConvertResult | None, parity: ParityReport | None,
                      serve_check: ServeCheckResult | None, required: tuple[str, ...],
                      run_root: Path | None = None) -> list[ArtifactOutcome]:
    """Each artifact's outcome from the stage records (convert, validate and serve-check; None: not run yet).

    An artifact is published when it was produced, passed the parity gate and answered correctly from our
    server (a kind our server does not serve, such as TF.js, on the parity gate alone); otherwise it is left
    out with the first stage's reason. A stage whose record is None has not run yet and leaves nothing out
    (the serve-check stages the candidate from the earlier stages' outcomes). With `run_root`, each
    left-out artifact's full reason is written to `<run_root>/reasons/<artifact>.txt`.

    The run's final verdict is computed once, by the publish stage (`PublishResult.outcomes`); the manifest,
    `summary.json`, the report, `ShipResult` and the command line all show that one list.
    """
    outcomes = [ArtifactOutcome(SAVED_MODEL, PUBLISHED, "", "", "saved_model.pb", True)]
    for conversion in converted.outcomes if converted is not None else ():
        name = conversion.name
        row = parity.row(name) if parity is not None else None
        serve = serve_check.verdict(name) if serve_check is not None else None
        if conversion.status != ConversionStatus.PRODUCED:
            stage, reason = "convert", f"{conversion.status}: {conversion.reason}"
        elif row is not None and not row.passed:
            stage, reason = "validate", row.reason
        elif serve is not None and not serve[0]:
            stage, reason = "serve-check", serve[1]
        elif parity is not None and row is None:
            stage, reason = "validate", "not checked by the parity gate"
        elif serve_check is not None and serve is None and _served(name):
            stage, reason = "serve-check", "not served by the serve-check"
        else:
            stage, reason = "", ""
        outcomes.append(ArtifactOutcome(name, LEFT_OUT if reason else PUBLISHED, stage, first_line(reason, None),
                                        _filename(name), name in required, full_reason=reason))
    if run_root is not None:
        files = write_reason_files(run_root, {o.artifact: o.full_reason for o in outcomes})
        outcomes = [replace(o, reason_file=files.get(o.artifact, "")) for o in outcomes]
    return outcomes


def left_out_files(outcomes: list[ArtifactOutcome]) -> list[str]:
    """File names (in the version folder) of the artifacts left out, companions included (`model.onnx.data`)."""
    kinds = artifact_kinds()
    return [name for o in outcomes if o.status == LEFT_OUT and o.artifact in kinds for name in kinds[o.artifact].files]


def run_status(outcomes: list[ArtifactOutcome]) -> RunStatus:
    """`published` when every artifact was published, else `partial` (a run that published anything)."""
    return RunStatus.PARTIAL if any(o.status == LEFT_OUT for o in outcomes) else RunStatus.PUBLISHED


def status_line(outcomes: list[ArtifactOutcome]) -> str:
    """One line for people and CI logs, e.g. `status: partial (1 of 6 artifacts left out: tflite_int8)`."""
    left = [o.artifact for o in outcomes if o.status == LEFT_OUT]
    if not left:
        return f"status: published (all {len(outcomes)} artifacts published)"
    return f"status: partial ({len(left)} of {len(outcomes)} artifacts left out: {', '.join(left)})"


# Each artifact's reason for not carrying a signature, in `signatures[...]["note"]`, is cut to this many characters.
NOTE_REASON_LIMIT = 160


def _verdict(artifacts: list[str], verdicts: dict[str, str]) -> str:
    """`passed` when every carrier's check passed, else `artifact: reason` for the others."""
    failed = {a: v for a, v in verdicts.items() if a in artifacts and v != "passed"}
    return "; ".join(f"{a}: {v}" for a, v in failed.items()) if failed else "passed" if verdicts else "not run"


def _answer_text(answer: tuple[bool, str]) -> str:
    passed, reason = answer
    return "passed" if passed else reason


def signature_carriers(signatures: list[str], default: str, outcomes: list[ArtifactOutcome],
                       serve_check: ServeCheckResult | None = None,
                       carried: Mapping[str, tuple[str, ...] | SignatureCarriage] | None = None
                       ) -> dict[str, dict[str, Any]]:
    """{signature name: published artifacts that carry it, the file of each, its serve-check verdict, the
    published artifacts that do not carry it with why (`left_out`, one line each), and a note saying so}.

    `carried`: {artifact: signature names its files answer, or its `SignatureCarriage` (files and reasons)}
    (default: the SavedModel carries every one, the converted artifacts `default` alone). The verdict comes
    from the serve-check's record: `passed` when every served carrier answered it correctly, else each carrier's
    reason (a failure, or why it was not asked: `signatures_unchecked`).
    """
    published = [o.artifact for o in outcomes if o.status == PUBLISHED]
    carried = carried or {SAVED_MODEL: tuple(signatures)}
    served = tuple(serve_check.artifacts) if serve_check is not None else ()
    unchecked = serve_check.signatures_unchecked if serve_check is not None else {}
    carriers: dict[str, dict[str, Any]] = {}
    for name in signatures:
        if name == default:
            artifacts = published
            verdicts = {a: _answer_text(answer) for a in served
                        if serve_check is not None and (answer := serve_check.verdict(a)) is not None}
        else:
            artifacts = [a for a in published if name in carried.get(a, ())]
            verdicts = {}
            for artifact in artifacts:
                answer = serve_check.signature_verdict(artifact, name) if serve_check is not None else None
                reason = unchecked.get(artifact, {}).get(name)
                if answer is not None:
                    verdicts[artifact] = _answer_text(answer)
                elif reason or artifact in served:
                    verdicts[artifact] = reason or "not asked"
        described = {a: c for a, c in carried.items() if isinstance(c, SignatureCarriage)}
        files = {a: described[a].files[name] for a in artifacts if a in described and name in described[a].files}
        left_out = {a: first_line(described[a].left_out[name], NOTE_REASON_LIMIT) for a in published
                    if a not in artifacts and a in described and name in described[a].left_out}
        carriers[name] = {"artifacts": artifacts, "files": files, "serve_check": _verdict(artifacts, verdicts),
                          "left_out": left_out,
                          "note": "; ".join(f"not in {a}: {why}" for a, why in left_out.items())}
    return carriers

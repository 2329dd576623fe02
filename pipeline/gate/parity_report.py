"""The validate stage's record: every artifact's parity against the SavedModel (`parity.json`).

`ParityReport.to_json` / `from_json` are the record's JSON form; `pipeline.gate.validate.validate_artifacts`
builds it. Nothing here imports TensorFlow.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tfship.pipeline.conversion.artifacts import SAVED_MODEL
from tfship.pipeline.gate.compare import ERROR_BIN_EDGES, OutputParity
from tfship.pipeline.gate.noise import ImplementationNoise, ReferenceNoise

__all__ = ["ArtifactParity", "ParityReport", "SignatureVerdict", "verdicts_from_json", "verdicts_to_json"]


@dataclass(frozen=True)
class SignatureVerdict:
    """One artifact judged on one signature besides `serving_default` (`parity.json`'s `signatures` rows).

    Attributes:
        checked: whether the data could feed it (False: nothing ran; `reason` says why).
        passed: within its family's bound at every batch size (True when not checked).
        reason: the misses (up to three, each naming its batch size), or why it was not checked; "" when passed.
        max_abs_error: the largest difference from the SavedModel's answers (float outputs).
        set_aside: where its own file was moved after a miss (ONNX's file per signature); "" when not moved.
    """

    checked: bool
    passed: bool = True
    reason: str = ""
    max_abs_error: float = 0.0
    set_aside: str = ""

    def to_json(self) -> dict[str, Any]:
        row = asdict(self)
        return row if self.set_aside else {k: v for k, v in row.items() if k != "set_aside"}

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> SignatureVerdict:
        """A verdict from its `parity.json` row. Raises: TypeError, an unknown or missing field."""
        return cls(**{**payload, "set_aside": payload.get("set_aside") or ""})


def verdicts_to_json(verdicts: dict[str, dict[str, SignatureVerdict]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{artifact: {signature: row}} as `parity.json` holds it."""
    return {artifact: {name: verdict.to_json() for name, verdict in rows.items()}
            for artifact, rows in verdicts.items()}


def verdicts_from_json(payload: dict[str, Any]) -> dict[str, dict[str, SignatureVerdict]]:
    """The typed verdicts of `parity.json`'s `signatures`. Raises: TypeError, a row that is not a verdict."""
    return {artifact: {name: SignatureVerdict.from_json(row) for name, row in rows.items()}
            for artifact, rows in payload.items()}


@dataclass(frozen=True)
class ArtifactParity:
    """One artifact's verdict.

    metric: the task metric measured (worst over batch sizes); tie_adjusted_metric: the same with tie
    flips counted as agreeing with the SavedModel (what the verdict uses); top1_agreement: % of rows whose
    predicted class equals the SavedModel's (None for regression); flips / tie_flips: rows whose class
    differs, and how many of them are ties; error_bound: the measured error bound used for ties;
    float64_errors: {float output: max |artifact - the SavedModel's graph in float64|} (None: not measured);
    accuracy_decision, flips_decision: the accuracy drop and the share of flipped rows decided with
    confidence (`pipeline.gate.confidence.Decision` as a dict: verdict, estimate, low, high, allowed,
    confidence, rows, rows_to_decide, method; None for regression; accuracy_decision is None for a binary
    output judged by AUC, whose drop is auc_decision: DeLong's paired test, `pipeline.gate.auc_drop`);
    undecided: the decisions too few rows could take, described ("" when every decision was taken);
    regression_decision: a regression task's judgement (`regression_judgement.RegressionDecision` as a dict: the
    paired MAE and RMSE changes, the per-row quantile and its bound; None otherwise); reference: the row is the
    SavedModel itself, the reference the others are judged against (no decision is taken on it);
    latency_ms_batch1: median ms per call at batch 1; outputs: per-output rows.
    """

    artifact: str
    kind: str
    mode: str
    size_bytes: int
    metric: float
    top1_agreement: float | None
    latency_ms_batch1: float
    outputs: tuple[OutputParity, ...]
    batch_sizes: tuple[int, ...]
    passed: bool
    reason: str = ""
    tie_adjusted_metric: float | None = None
    flips: int | None = None
    tie_flips: int | None = None
    error_bound: float | None = None
    float64_errors: dict[str, float] | None = None
    accuracy_decision: dict[str, Any] | None = None
    flips_decision: dict[str, Any] | None = None
    undecided: str = ""
    auc_decision: dict[str, Any] | None = None
    regression_decision: dict[str, Any] | None = None
    reference: bool = False


@dataclass(frozen=True)
class ParityReport:
    """Every artifact's parity against the SavedModel on held-out data.

    metric: `accuracy_%`, `auc` (a binary output, `core.tasks.primary("binary")`) or `mae`; metric_output: the
    output scored; label_source: `labels` or `reference` (no labels given: the SavedModel's predictions are the
    labels); required: artifacts whose failure fails the stage (`convert.required`; the SavedModel always);
    noise: the SavedModel's own largest difference per float output (`reference_noise`), allowed on top of every bound;
    signatures: {artifact: {signature: `SignatureVerdict`}} for the signatures besides `serving_default`
    (`with_other_signatures`); signature_noise: {signature: {float output: the SavedModel's own noise on it}};
    implementation_noise: the SavedModel's own float32 rounding error per float output
    (`pipeline.gate.noise.implementation_noise`), allowed `validate.implementation_noise_multiplier` times on top
    of the float32 bound; signature_implementation_noise: the same per other signature; golden_set: the held-out
    rows against the rows the count decisions need (`pipeline.gate.golden_size.golden_set`: rows, needed,
    enough, decisions, note).

    `to_json` is the validate stage's record (`parity.json`); `from_json` reads it back.
    """

    reference_metric: float
    samples: int
    rows: tuple[ArtifactParity, ...]
    metric: str = "accuracy_%"
    metric_output: str = ""
    label_source: str = "labels"
    required: tuple[str, ...] = ()
    noise: dict[str, ReferenceNoise] = field(default_factory=dict)
    signatures: dict[str, dict[str, SignatureVerdict]] = field(default_factory=dict)
    signature_noise: dict[str, dict[str, ReferenceNoise]] = field(default_factory=dict)
    implementation_noise: dict[str, ImplementationNoise] = field(default_factory=dict)
    signature_implementation_noise: dict[str, dict[str, ImplementationNoise]] = field(default_factory=dict)
    golden_set: dict[str, Any] = field(default_factory=dict)

    def row(self, artifact: str) -> ArtifactParity | None:
        """The row of `artifact`, or None when the gate did not check it."""
        return next((row for row in self.rows if row.artifact == artifact), None)

    def with_other_signatures(self, verdicts: dict[str, dict[str, SignatureVerdict]],
                              noise: dict[str, dict[str, ReferenceNoise]] | None = None,
                              implementation: dict[str, dict[str, ImplementationNoise]] | None = None
                              ) -> ParityReport:
        """This report with the other signatures' verdicts and the SavedModel's own noise on each
        (`pipeline.gate.signatures.validate_other_signatures`): an artifact whose other signature missed fails
        its row (the reason names each signature), so it is left out, and the gate fails when that artifact is
        required. A signature file of its own that missed was set aside (`set_aside`): the rest of its
        artifact stays.
        """
        rows = []
        for row in self.rows:
            missed = [f"signature '{name}': {v.reason}" for name, v in verdicts.get(row.artifact, {}).items()
                      if not v.passed and not v.set_aside]
            rows.append(replace(row, passed=False, reason="; ".join(missed)) if missed and row.passed else row)
        return replace(self, rows=tuple(rows), signatures=verdicts, signature_noise=dict(noise or {}),
                       signature_implementation_noise=dict(implementation or {}))

    @property
    def passed(self) -> bool:
        """The gate's verdict: the SavedModel and every required artifact passed."""
        return all(row.passed for row in self.rows if row.artifact == SAVED_MODEL or row.artifact in self.required)

    @property
    def left_out(self) -> dict[str, str]:
        """{artifact: reason} for every optional artifact that failed (left out of the version)."""
        return {row.artifact: row.reason for row in self.rows if not row.passed}

    @property
    def reference_accuracy(self) -> float | None:
        """The SavedModel's accuracy (%) for classification, else None."""
        return self.reference_metric if self.metric == "accuracy_%" else None

    def to_json(self) -> dict[str, Any]:
        """JSON form for the manifest and report.json (`error_bin_edges` are the histogram bins)."""
        return {"passed": self.passed, "left_out": self.left_out, "required": list(self.required),
                "metric": self.metric, "metric_output": self.metric_output,
                "label_source": self.label_source, "reference_metric": self.reference_metric,
                "reference_accuracy": self.reference_accuracy, "samples": self.samples,
                "resolution": 100.0 / self.samples if self.metric == "accuracy_%" and self.samples else None,
                "error_bin_edges": [e if e != float("inf") else None for e in ERROR_BIN_EDGES],
                "reference_noise": {name: asdict(value) for name, value in self.noise.items()},
                "implementation_noise": {name: asdict(value) for name, value in self.implementation_noise.items()},
                "artifacts": [asdict(row) for row in self.rows], "signatures": verdicts_to_json(self.signatures),
                "signature_noise": {name: {output: asdict(value) for output, value in outputs.items()}
                                    for name, outputs in self.signature_noise.items()},
                "signature_implementation_noise": {
                    name: {output: asdict(value) for output, value in outputs.items()}
                    for name, outputs in self.signature_implementation_noise.items()},
                "golden_set": self.golden_set}

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> ParityReport:
        """Inverse of `to_json` (`parity.json`).

        Raises:
            KeyError, TypeError: `payload` is not a parity record.
        """
        rows = tuple(replace(ArtifactParity(**row), batch_sizes=tuple(row["batch_sizes"]), outputs=tuple(
            OutputParity(**(output | {"error_histogram": tuple(output.get("error_histogram", ()))}))
            for output in row["outputs"])) for row in payload["artifacts"])
        noise = {name: ReferenceNoise(value["max_abs"], tuple(value["batch_sizes"]))
                 for name, value in payload.get("reference_noise", {}).items()}
        signature_noise = {name: {output: ReferenceNoise(value["max_abs"], tuple(value["batch_sizes"]))
                                  for output, value in outputs.items()}
                           for name, outputs in payload.get("signature_noise", {}).items()}
        implementation = {name: ImplementationNoise(**value)
                          for name, value in payload.get("implementation_noise", {}).items()}
        by_signature = {name: {output: ImplementationNoise(**value) for output, value in outputs.items()}
                        for name, outputs in payload.get("signature_implementation_noise", {}).items()}
        verdicts = verdicts_from_json(payload.get("signatures", {}))
        return cls(payload["reference_metric"], payload["samples"], rows, payload["metric"], payload["metric_output"],
                   payload["label_source"], tuple(payload["required"]), noise, verdicts, signature_noise,
                   implementation, by_signature, payload.get("golden_set", {}))

"""Verdicts a user can read and act on (issue 41): the SavedModel's row is the `reference`, an undecided verdict is
explained in one line with the rows that would decide, the tie counts have a legend, reasons are never cut
(the API carries the whole text, the terminal wraps it), regression shows MAE and RMSE, a dynamic-range file that
quantised nothing is named, and the outlier allowance names its setting. Real ONNX files
through the gate's own API; the terminal lines are rendered by rich as `tfship run` prints them."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from rich.console import Console

from tfship.pipeline.api.results import ShipResult
from tfship.pipeline.config import load_config
from tfship.pipeline.conversion.artifacts import Artifact
from tfship.pipeline.gate.validate import tolerance_for, validate_artifacts
from tfship.pipeline.orchestration.outcomes import ArtifactOutcome, OutcomeStatus
from tfship.pipeline.orchestration.report import summary_notes, summary_tables, verdict_text, write_report
from tfship.pipeline.orchestration.stages import RunFolder
from tfship.pipeline.orchestration.verdict_notes import unquantised_lines

from .test_decisions_with_confidence import CLASSES, _flipping_set
from .test_gates import _contract, _linear_onnx
from .test_regression_judgement import _diabetes
from .test_regression_judgement import _judge as _judge_regression


def _terminal(summary: dict, width: int = 120) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    for table in summary_tables(summary, []):
        console.print(table)
    for note in summary_notes(summary):
        console.print(note, highlight=False, markup=False)
    return console.export_text()


def _identical_on_360_rows(tmp_path: Path):
    """The SavedModel and a float32 ONNX file that is the same model, on 360 rows (digits' test split)."""
    weights = np.eye(CLASSES + 1, CLASSES)
    reference = _linear_onnx(tmp_path / "reference", weights, np.zeros(CLASSES))
    candidate = _linear_onnx(tmp_path / "candidate", weights, np.zeros(CLASSES))
    inputs = _flipping_set(360, 0)
    return validate_artifacts(Artifact("saved_model", "onnx", "float32", reference),
                              [Artifact("onnx", "onnx", "float32", candidate)], _contract(CLASSES + 1, CLASSES),
                              inputs, np.zeros(360, np.int64), load_config().parity)


def _summary(parity, outcomes: list[ArtifactOutcome]) -> dict:
    return {"status": "partial", "status_line": "status: partial", "published": None, "audit_passed": True,
            "run": "r", "parity": parity.to_json(), "artifacts": [o.to_json() for o in outcomes]}


def test_reference_row_and_undecided_explained_in_one_line(tmp_path):
    """No row lost on 360 rows: the copy is `pass (undecided)`, the SavedModel `reference` (terminal, report.md,
    ShipResult), and one line says that 360 rows cannot tell a 0.5-point drop from noise and 736 would."""
    parity = _identical_on_360_rows(tmp_path)
    reference, copy = (row.__dict__ | {"outputs": []} for row in parity.rows)
    assert reference["reference"] and not reference["undecided"] and reference["accuracy_decision"] is None
    assert verdict_text(reference, short=True) == "reference" and verdict_text(copy, short=True) == "pass (undecided)"
    outcomes = [ArtifactOutcome("saved_model", OutcomeStatus.PUBLISHED, "", "", "saved_model.pb", True),
                ArtifactOutcome("onnx", OutcomeStatus.PUBLISHED, "", "", "model.onnx", False)]
    summary = _summary(parity, outcomes)
    text = _terminal(summary, width=220)
    assert "reference" in text and "pass (undecided)" in text and "…" not in text, text
    line = next(line for line in summary_notes(summary) if line.startswith("undecided"))
    assert "undecided (onnx): 360 held-out rows cannot tell a 0.5-point accuracy drop" in line, line
    assert "736 would decide" in line and "data.test_fraction" in line and "validate.undecided = publish" in line
    assert any(line.startswith("flips (ties): ") and "a tie is a flip" in line for line in summary_notes(summary))
    run = RunFolder(tmp_path / "run")
    run.root.mkdir()
    _, markdown = write_report(run, summary)
    report = markdown.read_text()
    assert "| saved_model | float32 |" in report and "| reference |" in report and "undecided (onnx)" in report
    result = ShipResult.from_summary("m", run, summary, [], outcomes)
    assert result.artifact("saved_model").verdict == "reference"
    assert result.artifact("onnx").verdict == "pass (undecided)"


def test_reasons_are_never_cut(tmp_path):
    """A 700-character refusal: whole in `ArtifactResult.reason` and `result.errors`, wrapped (not cut) in the
    terminal; the reason file holds it for a result loaded later."""
    parity = _identical_on_360_rows(tmp_path)
    reason = "refused: " + "; ".join(f"output 'logits_{i}' max abs error {i}.5 outside tolerance" for i in range(14))
    assert len(reason) > 600
    run = RunFolder(tmp_path / "run")
    (run.root / "reasons").mkdir(parents=True)
    (run.root / "reasons" / "onnx.txt").write_text(reason + "\n")
    outcomes = [ArtifactOutcome("saved_model", OutcomeStatus.PUBLISHED, "", "", "saved_model.pb", True),
                ArtifactOutcome("onnx", OutcomeStatus.LEFT_OUT, "validate", reason, "model.onnx", False,
                                "reasons/onnx.txt", full_reason=reason)]
    summary = _summary(parity, outcomes)
    result = ShipResult.from_summary("m", run, summary, [], outcomes)
    assert result.artifact("onnx").reason == reason and result.errors == [f"onnx (validate): {reason}"]
    stored = [ArtifactOutcome.from_json(o.to_json()) for o in outcomes]  # as report.json gives them back
    assert ShipResult.from_summary("m", run, summary, [], stored).artifact("onnx").reason == reason
    text = " ".join(_terminal(summary).split())
    assert "…" not in text and "output 'logits_13' max abs error 13.5 outside tolerance" in text, text


def test_regression_shows_mae_and_rmse_and_how_it_was_judged(tmp_path):
    """A regression run's terminal table has MAE and RMSE columns, and one line says the allowance and the
    per-row bound in label units; report.md says it too."""
    _, _, weights, _ = _diabetes()
    parity = _judge_regression(tmp_path, weights * 1.0005)
    outcomes = [ArtifactOutcome("saved_model", OutcomeStatus.PUBLISHED, "", "", "saved_model.pb", True),
                ArtifactOutcome("tflite_int8", OutcomeStatus.PUBLISHED, "", "", "model_int8.tflite", False)]
    summary = _summary(parity, outcomes)
    text = _terminal(summary)
    assert "MAE" in text and "RMSE" in text, text
    line = next(line for line in summary_notes(summary) if line.startswith("regression:"))
    assert "SavedModel MAE 43.28, RMSE 53.48 on 442 rows" in line and "on 99 rows of 100" in line, line
    run = RunFolder(tmp_path / "run")
    run.root.mkdir()
    report = write_report(run, summary)[1].read_text()
    assert "| MAE | RMSE |" in report and "| 43.28 | 53.48 |" in report and "regression: SavedModel MAE" in report
    assert "| tflite_int8 | passed: 43.28 -> " in report and "SavedModel's own MAE 43.28); 0 of 442 rows over it |" in report, report


def test_a_dynamic_range_file_that_quantised_nothing_is_named_identical_to_float32():
    """Same size and the same error on every output as tflite_float32 (a model whose weights are all under 1,024
    elements): one line says so and what to do; a file that did shrink gets none."""
    def row(name, mode, size, error):
        return {"artifact": name, "mode": mode, "size_bytes": size, "passed": True,
                "outputs": [{"output": "target", "max_abs_error": error}]}

    same = {"artifacts": [row("tflite_float32", "float32", 4580, 6.1e-05),
                          row("tflite_dynamic_range", "dynamic_range", 4580, 6.1e-05)]}
    line, = unquantised_lines(same)
    assert line.startswith("tflite_dynamic_range is identical to tflite_float32 in effect (4580 bytes against 4580")
    assert "leave it out of convert.tflite_modes" in line
    shrunk = {"artifacts": [row("tflite_float32", "float32", 45800, 6.1e-05),
                            row("tflite_dynamic_range", "dynamic_range", 12000, 8.3e-02)]}
    assert unquantised_lines(shrunk) == []


def test_the_outlier_allowance_names_its_setting():
    tolerance = tolerance_for("int8", load_config().parity)
    text = tolerance.describe(np.array([21.9]), 4.8e-06)
    assert text.endswith("(up to 0.1 % of the output's elements may exceed it: validate.int8.outlier_fraction)"), text


def test_a_regression_file_undecided_by_its_per_row_rule_is_explained_by_that_rule(tmp_path):
    """A float32 copy of a diabetes fit on 121 held-out rows (what a 25 % test split of its 442 rows holds out):
    the MAE and RMSE changes pass, no row is over the per-row bound, and 121 rows still cannot show that at most
    1 row in 100 would be (0.99^121 > 0.025; 368 rows can). The terminal line says that rule, not a loss that is
    "neither within nor beyond" (the MAE and RMSE changes were decided)."""
    from tfship.core.contract import Signature, TensorSpec

    inputs, labels, weights, bias = _diabetes()
    inputs, labels = {"x": inputs["x"][:121]}, labels[:121]
    reference = _linear_onnx(tmp_path / "reference", weights, bias, argmax=False)
    candidate = _linear_onnx(tmp_path / "candidate", weights * 1.00001, bias, argmax=False)
    contract = Signature.of("serving_default", (TensorSpec(name="x", dtype="float32", shape=(None, 11)),),
                            (TensorSpec(name="logits", dtype="float32", shape=(None, 1)),))
    parity = validate_artifacts(Artifact("saved_model", "onnx", "float32", reference),
                                [Artifact("onnx", "onnx", "float32", candidate)], contract, inputs, labels,
                                load_config().parity)
    decision = parity.to_json()["artifacts"][-1]["regression_decision"]
    assert (decision["mae"]["verdict"], decision["rmse"]["verdict"], decision["row_verdict"]) == (
        "passed", "passed", "undecided")
    line = next(line for line in summary_notes(_summary(parity, [])) if line.startswith("undecided"))
    assert line.startswith("undecided (onnx): their MAE and RMSE changes are within the allowance, but on 121 "
                           "held-out rows (0 over the per-row bound "), line
    assert "cannot show that at most 1 % of rows move a prediction further; about 368 rows would decide" in line, line

"""What the API returns: a shipped run (`ShipResult`), one stage (`StageResult`) and an artifact's signatures
(`Inspection`), each shown as tables in a notebook (HTML / Markdown) and a terminal (rich).

They are read from a run folder's own records (`report.json`, `stages.json`), so `ShipResult.load(run)`
shows a finished or failed run later exactly as `tfship.ship` returned it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfship.pipeline.api.tables import Table, render_html, render_markdown, render_rich
from tfship.pipeline.orchestration.outcomes import ArtifactOutcome, OutcomeStatus
from tfship.pipeline.orchestration.run_config import RunConfig
from tfship.pipeline.orchestration.stages import RunFolder, StageRecord, StageStatus

SAVED_MODEL = "saved_model"


def _verdict(row: dict[str, Any]) -> str:
    """A parity row's verdict in one word (`ArtifactResult.verdict`)."""
    if not row["passed"]:
        return "fail"
    if row.get("reference") or (row["artifact"] == SAVED_MODEL and "reference" not in row):
        return "reference"
    return "pass (undecided)" if row.get("undecided") else "pass"


def _whole_reason(root: Path, outcome: ArtifactOutcome) -> str:
    """The outcome's whole reason: the stage's text, else its reason file in the run folder, else the line."""
    if outcome.full_reason:
        return outcome.full_reason.rstrip()
    stored = root / outcome.reason_file if outcome.reason_file else None
    if stored is not None and stored.is_file():
        return stored.read_text(encoding="utf-8").rstrip()
    return outcome.reason


@dataclass(frozen=True)
class ArtifactResult:
    """One artifact of a run: `outcome` is `published` or `left out`, decided by `stage` for `reason`.

    reason: the stage's whole reason, never cut (also in `<run>/reasons/<artifact>.txt`); path: the file (the
    version folder for the SavedModel) in the published version; None when left out or when nothing was
    published. required: a left-out required artifact fails the run. verdict: the parity gate's word on it:
    `reference` (the SavedModel, what the others are judged against), `pass`, `pass (undecided)` (too few
    held-out rows to decide; `validate.undecided = publish` let it through), `fail`, or `not judged`.
    """

    name: str
    outcome: str
    stage: str
    reason: str
    path: Path | None
    required: bool
    verdict: str = "not judged"

    @property
    def published(self) -> bool:
        return self.outcome == "published"


@dataclass(frozen=True)
class ShipResult:
    """One pipeline run: export -> convert -> validate -> serve-check -> publish (training first when built in).

    status: `published` (every artifact), `partial` (optional artifacts left out) or `failed` (nothing
    published); status_line: the same in one sentence; run: the run folder; report: its `report.md`;
    published: the version folder `<repository>/<model>/<version>` (None unless published); artifacts and
    stages: per-artifact outcomes and per-stage records; error: the failing stage's error (failed runs);
    summary: the run's full report (`report.json`: parity figures, conversions, audit, training).
    """

    model_name: str
    status: str
    status_line: str
    run: Path
    report: Path | None
    published: Path | None
    version: int | None
    artifacts: tuple[ArtifactResult, ...]
    stages: tuple[StageRecord, ...]
    error: str | None = None
    summary: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """Whether a version was published (`published` or `partial`)."""
        return self.status != "failed"

    @property
    def errors(self) -> list[str]:
        """Every problem in one list: the run's error, then each left-out artifact as `name (stage): reason`."""
        problems = [self.error] if self.error else []
        return problems + [f"{a.name} ({a.stage}): {a.reason}" for a in self.artifacts if not a.published]

    def artifact(self, name: str) -> ArtifactResult:
        """The artifact called `name` (`saved_model`, `onnx`, `tflite_float32`, ...); KeyError names the others."""
        for artifact in self.artifacts:
            if artifact.name == name:
                return artifact
        raise KeyError(f"no artifact {name!r} in {self.run}; artifacts: {[a.name for a in self.artifacts]}")

    @classmethod
    def from_summary(cls, model_name: str, run: RunFolder, summary: dict[str, Any], records: list[StageRecord],
                     outcomes: Sequence[ArtifactOutcome] | None = None) -> ShipResult:
        """Build from a run's summary (`pipeline.orchestration.run.run_summary`), its stage records and the
        artifacts' outcomes (the publish stage's `PublishResult.outcomes`; None: the summary's `artifacts`, as
        `summary.json` / `report.json` store them).
        """
        version_dir = Path(summary["published"]) if summary.get("published") else None
        if outcomes is None:
            stored_rows: list[dict[str, Any]] = summary.get("artifacts") or []
            outcomes = [ArtifactOutcome.from_json(row) for row in stored_rows]
        artifacts: list[ArtifactResult] = []
        parity: dict[str, Any] = summary.get("parity") or {}
        verdicts = {row["artifact"]: _verdict(row) for row in parity.get("artifacts", [])}
        for outcome in outcomes:
            path = None
            if version_dir is not None and outcome.status == OutcomeStatus.PUBLISHED:
                whole = outcome.artifact == SAVED_MODEL or not outcome.file
                path = version_dir if whole else version_dir / outcome.file
            verdict = verdicts.get(outcome.artifact, "reference" if outcome.artifact == SAVED_MODEL else "not judged")
            artifacts.append(ArtifactResult(outcome.artifact, str(outcome.status), outcome.stage,
                                            _whole_reason(run.root, outcome), path, outcome.required, verdict))
        report = run.root / "report.md"
        return cls(model_name, summary["status"], summary.get("status_line", f"status: {summary['status']}"),
                   run.root, report if report.is_file() else None, version_dir, summary.get("version"),
                   tuple(artifacts), tuple(records), summary.get("error"), summary)

    @classmethod
    def load(cls, run: Path | str) -> ShipResult:
        """The result of the run in folder `run`, finished or failed, from its `report.json` and `stages.json`.

        Raises:
            FileNotFoundError: `run` holds no report.json (the run has not finished).
        """
        folder = RunFolder(Path(run).resolve())
        summary = json.loads((folder.root / "report.json").read_text(encoding="utf-8"))
        stored = folder.root / "stages.json"
        rows: list[dict[str, Any]] = json.loads(stored.read_text(encoding="utf-8")) if stored.is_file() else []
        records = [StageRecord(r["name"], StageStatus(r["status"]), r["seconds"], r["reason"], r["summary"])
                   for r in rows]
        return cls.from_summary(RunConfig.read(folder).config.run.model_name, folder, summary, records)

    def tables(self) -> list[Table]:
        """The artifacts table and the stages table."""
        artifacts = Table("artifacts", ("artifact", "verdict", "outcome", "stage", "reason", "path", "required"),
                          tuple((a.name, a.verdict, a.outcome, a.stage or "-", a.reason or "-",
                                 str(a.path) if a.path else "-", "yes" if a.required else "no")
                                for a in self.artifacts))
        stages = Table("stages", ("stage", "status", "seconds", "note"), tuple(
            (r.name, StageStatus(r.status).value, f"{r.seconds:.1f}", r.reason or "-") for r in self.stages))
        return [artifacts, stages]

    def _heading(self) -> str:
        where = f"published {self.published}" if self.published else "nothing published"
        error = f"; error: {self.error}" if self.error else ""
        return f"tfship {self.model_name}: {self.status_line}; {where}; run {self.run}{error}"

    def _repr_html_(self) -> str:
        return render_html(self._heading(), self.tables())

    def _repr_markdown_(self) -> str:
        return render_markdown(self._heading(), self.tables())

    def __rich__(self):
        return render_rich(self._heading(), self.tables())

    def __str__(self) -> str:
        return self._repr_markdown_()


@dataclass(frozen=True)
class StageResult:
    """One stage run alone in a run folder (`tfship.export(run)`, `tfship.validate(run)`, ...).

    name: the stage; run: the run folder; value: what the stage returned (its typed result, e.g. the
    convert stage's conversions); fields: the same summarised as JSON-ready values.
    """

    name: str
    run: Path
    value: Any = field(repr=False)
    fields: dict[str, Any] = field(default_factory=dict, repr=False)

    def tables(self) -> list[Table]:
        rows: list[tuple[str, str]] = []
        for key, value in self.fields.items():
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            rows.append((str(key), text if len(text) < 400 else text[:400] + "…"))
        return [Table(f"tfship {self.name}", ("field", "value"), tuple(rows))]

    def _repr_html_(self) -> str:
        return render_html(f"{self.name}: ok; run {self.run}", self.tables())

    def _repr_markdown_(self) -> str:
        return render_markdown(f"{self.name}: ok; run {self.run}", self.tables())

    def __rich__(self):
        return render_rich(f"{self.name}: ok; run {self.run}", self.tables())


@dataclass(frozen=True)
class Inspection:
    """An artifact's signatures (`tfship.inspect(path)`): format, path, {signature: {inputs, outputs}} and, for a
    published version folder, its artifacts' outcomes (`info` holds it all as JSON-ready values).
    """

    info: dict[str, Any]

    @property
    def format(self) -> str:
        return self.info["format"]

    @property
    def signatures(self) -> dict[str, dict[str, list[dict[str, Any]]]]:
        return self.info.get("signatures", {})

    def tables(self) -> list[Table]:
        tables: list[Table] = []
        if self.info.get("artifacts"):
            tables.append(Table(f"artifacts (status: {self.info.get('status')})",
                                ("artifact", "outcome", "stage", "reason", "file", "required"), tuple(
                                    (r["artifact"], r["status"], r["stage"] or "-", r["reason"] or "-",
                                     r["file"] or "-", "yes" if r["required"] else "no")
                                    for r in self.info["artifacts"])))
        for name, signature in self.signatures.items():
            rows = tuple((kind[:-1], t["name"], str(t["dtype"]),
                          "<any rank>" if t["shape"] is None else str(list(t["shape"])))
                         for kind in ("inputs", "outputs") for t in signature[kind])
            tables.append(Table(f"signature_def['{name}']", ("kind", "name", "dtype", "shape"), rows))
        return tables

    def _repr_html_(self) -> str:
        return render_html(f"{self.format} {self.info['path']}", self.tables())

    def _repr_markdown_(self) -> str:
        return render_markdown(f"{self.format} {self.info['path']}", self.tables())

    def __rich__(self):
        return render_rich(f"{self.format} {self.info['path']}", self.tables())

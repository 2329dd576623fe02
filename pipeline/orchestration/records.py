"""Each stage's record in the run folder: its class, its file name, how it is written and read back.

A stage hands its result to later stages as a typed record on the `StageContext`
(`pipeline.orchestration.chain`), never as a JSON dict looked up by name. The same record is written into the run
folder, so a resumed run or a stage run alone reads it back (`RecordFile.load` / `require`) into the same type:

| stage | record | file(s) |
|---|---|---|
| train | `TrainRecord` | `train.json` |
| export | `ExportRecord` | `audit.json` (+ `export.json`) |
| convert | `pipeline.conversion.convert.ConvertResult` | `convert.json` (+ `convert_memory.json`) |
| validate | `pipeline.gate.validate.ParityReport` | `parity.json` |
| serve-check | `pipeline.gate.serve_check.ServeCheckResult` | `serve_check.json` |
| publish | `pipeline.orchestration.publish.PublishResult` | `summary.json` (written when the run finishes) |

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tfship.core.errors import StageError
from tfship.core.locations import parse_location
from tfship.core.manifest import MANIFEST_FILE, VersionManifest
from tfship.pipeline.conversion.convert import ConvertResult
from tfship.pipeline.gate.serve_check import ServeCheckResult
from tfship.pipeline.gate.validate import ParityReport
from tfship.pipeline.orchestration.outcomes import ArtifactOutcome
from tfship.pipeline.orchestration.publish import PublishResult
from tfship.pipeline.orchestration.stages import RunFolder

if TYPE_CHECKING:
    from tfship.pipeline.training.train_records import TrainResult

R = TypeVar("R")


@dataclass(frozen=True)
class TrainRecord:
    """The train stage's record: `TrainResult.summary()` (epochs, steps, traces, test accuracy in [0, 1], ...)
    and the per-epoch history (`EpochMetrics` as dicts).
    """

    summary: dict[str, Any]
    history: tuple[dict[str, Any], ...] = ()

    @property
    def test_accuracy(self) -> float | None:
        """Accuracy on the test split, a fraction in [0, 1] (None when not recorded)."""
        return self.summary.get("test_accuracy")

    @classmethod
    def from_result(cls, result: TrainResult) -> TrainRecord:
        """From a `pipeline.training.train.TrainResult`."""
        return cls(result.summary(), tuple(dict(h.__dict__) for h in result.history))

    def to_json(self) -> dict[str, Any]:
        return self.summary | {"history": list(self.history)}

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> TrainRecord:
        return cls({k: v for k, v in payload.items() if k != "history"}, tuple(payload.get("history", ())))


@dataclass(frozen=True)
class ExportRecord:
    """The export stage's record: `audit` is `audit.json` (`AuditReport.to_json()`, the behaviour checks under
    `behaviour`, and `passed`: audit and behaviour both passed); `details` is `export.json` (signatures written,
    precision, the recurrent model's unrolled source for TFLite, what the forward-only cleanup removed).
    """

    audit: dict[str, Any]
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """The graph audit and the behaviour checks (when on) passed."""
        return bool(self.audit.get("passed"))

    @property
    def signatures(self) -> tuple[str, ...]:
        """The SavedModel's signature names, as the audit saw them."""
        return tuple(self.audit.get("signatures", ()))

    def summary(self) -> dict[str, Any]:
        """`stages.json`'s line: audit verdict, op and variable counts, behaviour verdict (None when off)."""
        behaviour = self.audit.get("behaviour")
        return {"passed": not self.audit.get("violations"), "ops": sum(self.audit.get("op_histogram", {}).values()),
                "variables": len(self.audit.get("variables", ())),
                "behaviour": None if behaviour is None else bool(behaviour["passed"])}

    def tflite_sources(self) -> dict[str, Any]:
        """The TFLite recipes' sources the export wrote (`unrolled`: an unrolled copy's SavedModel, or None)."""
        recurrent: dict[str, Any] = self.details.get("recurrent") or {}
        source = recurrent.get("unrolled_source")
        return {"unrolled": source if source and Path(source).is_dir() else None,
                "unrolled_reason": recurrent.get("reason", "")}


@dataclass(frozen=True)
class RecordFile(Generic[R]):
    """Where a stage's record lives in the run folder and how it is read and written.

    stage: the stage's name (for messages); name: the file, relative to the run folder; read / write:
    `RunFolder -> record` (raising OSError, ValueError, KeyError or TypeError on a missing or malformed file) and
    `(RunFolder, record) -> None` (None: written elsewhere).
    """

    stage: str
    name: str
    read: Callable[[RunFolder], R]
    write: Callable[[RunFolder, R], None] | None = None

    def path(self, run: RunFolder) -> Path:
        return run.root / self.name

    def load(self, run: RunFolder) -> R | None:
        """The record in `run`, or None when it is missing or unreadable (the stage has not run, or must rerun)."""
        try:
            return self.read(run)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def require(self, run: RunFolder) -> R:
        """The record in `run`.

        Raises:
            StageError: it is missing ("run the <stage> stage first") or unreadable.
        """
        path = self.path(run)
        if not path.is_file():
            raise StageError(f"{path} does not exist; run the {self.stage} stage first")
        try:
            return self.read(run)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise StageError(f"{path} is not a readable {self.stage} record ({type(err).__name__}: {err}); "
                             f"run the {self.stage} stage again") from err

    def save(self, run: RunFolder, record: R) -> R:
        """Write `record` into `run`; return it."""
        if self.write is None:
            raise StageError(f"{self.name} is written when the run finishes, not by the {self.stage} stage")
        self.write(run, record)
        return record


def read_json(run: RunFolder, name: str) -> Any:
    """`<run>/<name>` parsed (raises OSError, ValueError)."""
    return json.loads((run.root / name).read_text(encoding="utf-8"))


def _optional_json(run: RunFolder, name: str) -> Any:
    try:
        return read_json(run, name)
    except (OSError, ValueError):
        return None


def _write_export(run: RunFolder, record: ExportRecord) -> None:
    run.write_json("export.json", record.details)
    run.write_json("audit.json", record.audit)


def _write_convert(run: RunFolder, record: ConvertResult) -> None:
    run.write_json("convert.json", record.to_json())
    run.write_json("convert_memory.json", record.memory)


def _read_publish(run: RunFolder) -> PublishResult:
    """The published version named in `summary.json`, its manifest (when the version is a local folder) and the
    artifact outcomes the publish stage decided (`summary.json`'s `artifacts`).
    """
    summary = read_json(run, "summary.json")
    version_dir = parse_location(summary["published"], "summary.json: published")
    if isinstance(version_dir, Path) and (version_dir / MANIFEST_FILE).is_file():  # a local folder
        manifest = VersionManifest.read(version_dir)
    else:
        manifest = VersionManifest(files=())
    outcomes = tuple(ArtifactOutcome.from_json(row) for row in summary.get("artifacts") or ())
    return PublishResult(int(summary["version"]), version_dir, manifest, outcomes)


def _writer(name: str) -> Callable[[RunFolder, Any], None]:
    def write(run: RunFolder, record: Any) -> None:
        run.write_json(name, record.to_json())

    return write


TRAIN: RecordFile[TrainRecord] = RecordFile(
    "train", "train.json", lambda run: TrainRecord.from_json(read_json(run, "train.json")), _writer("train.json"))
EXPORT: RecordFile[ExportRecord] = RecordFile(
    "export", "audit.json",
    lambda run: ExportRecord(dict(read_json(run, "audit.json")), dict(_optional_json(run, "export.json") or {})),
    _write_export)
CONVERT: RecordFile[ConvertResult] = RecordFile(
    "convert", "convert.json",
    lambda run: ConvertResult.from_json(read_json(run, "convert.json"), _optional_json(run, "convert_memory.json")),
    _write_convert)
VALIDATE: RecordFile[ParityReport] = RecordFile(
    "validate", "parity.json", lambda run: ParityReport.from_json(read_json(run, "parity.json")),
    _writer("parity.json"))
SERVE_CHECK: RecordFile[ServeCheckResult] = RecordFile(
    "serve-check", "serve_check.json", lambda run: ServeCheckResult.from_json(read_json(run, "serve_check.json")),
    _writer("serve_check.json"))
PUBLISH: RecordFile[PublishResult] = RecordFile("publish", "summary.json", _read_publish)

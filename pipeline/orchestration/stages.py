"""Stage bookkeeping: statuses, records and the run folder.

A stage is a plain function with a typed input and output (frozen dataclasses). The runner
(`pipeline.orchestration.run`) times each one, records an ok / failed / skipped `StageRecord` into
`runs/<run_id>/stages.json`, and stops at the first failure so nothing downstream runs.
"""

from __future__ import annotations

import datetime as _dt
import enum
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tfship.core.files import write_json_atomic


class StageStatus(str, enum.Enum):
    """Outcome of one stage."""

    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class StageRecord:
    """What one stage did: status, wall time in seconds, reason on failure, a small JSON summary."""

    name: str
    status: StageStatus
    seconds: float
    reason: str = ""
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunFolder:
    """`runs/<run_id>/` and its fixed sub-paths."""

    root: Path

    @classmethod
    def create(cls, runs_dir: Path, model_name: str) -> "RunFolder":
        """Create a new, uniquely named run folder: `<runs_dir>/<UTC time>-<model_name>-<4 hex>`."""
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        root = Path(runs_dir) / f"{stamp}-{model_name}-{secrets.token_hex(2)}"
        root.mkdir(parents=True, exist_ok=False)
        return cls(root.resolve())

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def saved_model(self) -> Path:
        return self.root / "artifacts" / "saved_model"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def candidate_repository(self) -> Path:
        """A private model repository holding the version being checked before it is published."""
        return self.root / "candidate"

    def write_json(self, name: str, payload: Any) -> Path:
        """Write `payload` as indented JSON to `<root>/<name>` atomically; returns the path."""
        return write_json_atomic(self.root / name, payload)

    def record_stages(self, records: list[StageRecord]) -> Path:
        """Persist the stage records (`stages.json`)."""
        return self.write_json("stages.json", [asdict(record) for record in records])

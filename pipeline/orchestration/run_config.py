"""A run folder's `config.json`: the config the run started with, as one typed record (`RunConfig`) with one writer
and one reader.

`config.json` holds the validated `PipelineConfig` (`model_dump(mode="json", by_alias=True)`) and, for an
export-only run (`tfship run --model ... --data ...`), its request under `export_only`
(`{"model": str, "data": absolute path, "tags": [str], "custom_objects": [str]}`). It is written when a run
starts (`tfship run`, `tfship train`, `tfship.train()`) and read by a resumed run, a stage run alone, the chain's
data loader, the report and `ShipResult.load`. Keys the config does not know (older or newer fields) are left out
when reading, as pydantic's `extra` rule of the config would otherwise refuse a run folder made by another version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tfship.core.errors import ConfigError
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.export_only.user_model import ORIGINS, ExportOnlyRequest
from tfship.pipeline.orchestration.stages import RunFolder

CONFIG_FILE = "config.json"
EXPORT_ONLY = "export_only"
ACCEPTED_ALIASES = ("validate",)  # the config's keys read under an alias (`[validate]` is `parity`)


@dataclass(frozen=True)
class RunConfig:
    """The config a run started with and, for an export-only run, its request (None otherwise)."""

    config: PipelineConfig
    export_only: ExportOnlyRequest | None = None

    def to_json(self) -> dict[str, Any]:
        """`config.json`'s object."""
        payload = self.config.model_dump(mode="json", by_alias=True)
        if self.export_only is not None:
            request = self.export_only
            payload[EXPORT_ONLY] = {"model": request.model, "data": str(Path(request.data).resolve()),
                                    "tags": list(request.tags), "custom_objects": list(request.custom_objects),
                                    "origin": request.origin}
        return payload

    @classmethod
    def from_json(cls, payload: Any, source: str | Path = CONFIG_FILE) -> RunConfig:
        """Parse `config.json`'s object.

        Raises:
            ConfigError: not an object, a config field invalid, or an `export_only` request without `model` or
                `data`; the message names `source` and the field.
        """
        if not isinstance(payload, dict):
            raise ConfigError(f"{source}: a run config is a JSON object, got {type(payload).__name__}")
        tree = {k: v for k, v in payload.items() if k in PipelineConfig.model_fields or k in ACCEPTED_ALIASES}
        try:
            config = PipelineConfig.model_validate(tree)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ConfigError(f"{source}: field {where!r}: {first['msg']} (got {str(first.get('input'))[:80]!r})"
                              ) from err
        return cls(config, _request(payload.get(EXPORT_ONLY), source))

    def write(self, run: RunFolder) -> RunConfig:
        """Write `<run>/config.json` (atomically); return self."""
        run.write_json(CONFIG_FILE, self.to_json())
        return self

    @classmethod
    def read(cls, run: RunFolder) -> RunConfig:
        """`<run>/config.json`, parsed.

        Raises:
            ConfigError: missing, not JSON, or refused by `from_json` (naming the file and field).
        """
        path = run.root / CONFIG_FILE
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path} does not exist (not a run folder, or its run never started)") from None
        except (OSError, ValueError) as err:
            raise ConfigError(f"{path}: cannot read it as JSON ({err})") from err
        return cls.from_json(payload, path)

    @staticmethod
    def exists(folder: Path) -> bool:
        """Whether `folder` holds a `config.json` (is a run folder)."""
        return (Path(folder) / CONFIG_FILE).is_file()


def _request(stored: Any, source: str | Path) -> ExportOnlyRequest | None:
    if stored is None:
        return None
    if not isinstance(stored, dict) or not isinstance(stored.get("model"), str) or \
            not isinstance(stored.get("data"), str):
        raise ConfigError(f"{source}: field {EXPORT_ONLY!r} must hold 'model' and 'data' strings, got "
                          f"{str(stored)[:120]!r}")
    origin = stored.get("origin")
    return ExportOnlyRequest(stored["model"], Path(stored["data"]), tuple(stored.get("tags", ("serve",))),
                             tuple(stored.get("custom_objects", ())),
                             origin if isinstance(origin, str) and origin in ORIGINS else "cli")

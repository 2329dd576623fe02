"""Which models to serve: TF Serving's ModelServerConfig (text format) or `--repository/--model-name`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from google.protobuf import text_format

from pipeline.errors import ConfigError
from serving import protocol

MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_model_name(name: str) -> str:
    """Return `name` if it is a safe model name (no path separators, no `..`); raise `ConfigError` otherwise."""
    if not MODEL_NAME_RE.match(name or "") or ".." in name:
        raise ConfigError(f"invalid model name {name!r}: use 1-64 of [A-Za-z0-9_.-], starting alphanumeric, no '..'")
    return name


@dataclass(frozen=True)
class VersionPolicy:
    """TF Serving's `model_version_policy`: `latest` N versions (default 1), `all`, or `specific` ones."""

    kind: Literal["latest", "all", "specific"] = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, on_disk: list[int]) -> list[int]:
        """Versions to serve among those found on disk (ascending)."""
        ordered = sorted(on_disk)
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered[-self.num_versions:] if self.num_versions > 0 else []


@dataclass(frozen=True)
class ModelConfig:
    """One served model: TF Serving's `ModelConfig` fields that tfship honours."""

    name: str
    base_path: Path
    platform: str = "tensorflow"
    policy: VersionPolicy = VersionPolicy()
    labels: dict[str, int] = field(default_factory=dict)


def from_repository(repository: Path, model_name: str) -> list[ModelConfig]:
    """Single-model config for `<repository>/<model_name>`, serving the latest version."""
    check_model_name(model_name)
    return [ModelConfig(name=model_name, base_path=Path(repository) / model_name)]


def parse_model_server_config(text: str, source: str = "<text>") -> list[ModelConfig]:
    """Parse a ModelServerConfig in protobuf text format (TF Serving's `--model_config_file`).

    Raises:
        ConfigError: unparsable text, `custom_model_config`, a bad name or duplicate names (names `source`).
    """
    try:
        proto = text_format.Parse(text, protocol.ModelServerConfig())
    except text_format.ParseError as err:
        raise ConfigError(f"{source}: not a ModelServerConfig in text format: {err}") from err
    return from_proto(proto, source)


def from_proto(proto, source: str = "<request>") -> list[ModelConfig]:
    """Convert a `tensorflow.serving.ModelServerConfig` message (also used by HandleReloadConfigRequest)."""
    if proto.WhichOneof("config") == "custom_model_config":
        raise ConfigError(f"{source}: custom_model_config is not supported; use model_config_list")
    configs, seen = [], set()
    for entry in proto.model_config_list.config:
        name = check_model_name(entry.name)
        if name in seen:
            raise ConfigError(f"{source}: model {name!r} is configured twice")
        seen.add(name)
        if not entry.base_path:
            raise ConfigError(f"{source}: model {name!r} has no base_path")
        configs.append(ModelConfig(name=name, base_path=Path(entry.base_path),
                                   platform=entry.model_platform or "tensorflow",
                                   policy=_policy(entry.model_version_policy), labels=dict(entry.version_labels)))
    return configs


def _policy(proto) -> VersionPolicy:
    kind = proto.WhichOneof("policy_choice")
    if kind == "all":
        return VersionPolicy("all")
    if kind == "specific":
        return VersionPolicy("specific", versions=tuple(proto.specific.versions))
    if kind == "latest":
        return VersionPolicy("latest", num_versions=proto.latest.num_versions or 1)
    return VersionPolicy()

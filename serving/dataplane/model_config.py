"""Which models to serve: TF Serving's ModelServerConfig (text format) or `--repository/--model-name`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from google.protobuf import text_format

from tfship.core import protocol
from tfship.core.errors import ConfigError
from tfship.core.locations import BucketUrl, Location, parse_location

MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# `model_platform` values tfship accepts: TF Serving's own name plus the artifact kinds the runtimes serve
# (the runtime itself is chosen by `--backend`); "" means "tensorflow", as in TF Serving.
PLATFORMS = ("tensorflow", "tflite", "onnx")


def check_model_name(name: str | None) -> str:
    """Return `name` if it is a safe model name (no path separators, no `..`); raise `ConfigError` otherwise."""
    if name is None or not MODEL_NAME_RE.match(name) or ".." in name:
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
    base_path: Location  # a folder, or an s3:// prefix until the mirror replaces it by its cache folder
    platform: str = "tensorflow"
    policy: VersionPolicy = VersionPolicy()
    labels: dict[str, int] = field(default_factory=dict)
    source: BucketUrl | None = None  # the bucket prefix `base_path` mirrors (serving.storage.mirror)


def from_repository(repository: Location, model_name: str) -> list[ModelConfig]:
    """Single-model config for `<repository>/<model_name>` (a folder or an s3:// prefix), latest version."""
    check_model_name(model_name)
    root = repository if isinstance(repository, BucketUrl) else Path(repository)
    return [ModelConfig(name=model_name, base_path=root / model_name)]


def parse_model_server_config(text: str, source: str = "<text>") -> list[ModelConfig]:
    """Parse a ModelServerConfig in protobuf text format (TF Serving's `--model_config_file`).

    Raises:
        ConfigError: unparsable text, `custom_model_config`, a bad name or duplicate names (names `source`).
    """
    try:
        proto = text_format.Parse(text, protocol.ModelServerConfig())
    except text_format.ParseError as err:
        raise ConfigError(f"Error parsing text-format tensorflow.serving.ModelServerConfig from {source}: "
                          f"{err}") from err  # TF Serving's wording: tools look for it
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
        base_path = parse_location(entry.base_path, f"{source}: model {name!r}: base_path")
        if isinstance(base_path, Path) and not base_path.is_absolute():
            raise ConfigError(f"{source}: model {name!r}: base_path {entry.base_path!r} must be an absolute path")
        platform = entry.model_platform or "tensorflow"
        if platform not in PLATFORMS:
            raise ConfigError(f"{source}: model {name!r}: model_platform {platform!r} is not supported; "
                              f"choose from {list(PLATFORMS)}")
        configs.append(ModelConfig(name=name, base_path=base_path, platform=platform,
                                   policy=_policy(entry.model_version_policy, f"{source}: model {name!r}"),
                                   labels=dict(entry.version_labels)))
    return configs


def _policy(proto, where: str) -> VersionPolicy:
    """`latest { num_versions: 0 }` means 1, as in TF Serving (proto3 cannot tell 0 from unset)."""
    kind = proto.WhichOneof("policy_choice")
    if kind == "all":
        return VersionPolicy("all")
    if kind == "specific":
        versions = tuple(proto.specific.versions)
        if not versions or any(v <= 0 for v in versions):
            raise ConfigError(f"{where}: model_version_policy.specific.versions must list positive versions, "
                              f"got {list(versions)}")
        return VersionPolicy("specific", versions=versions)
    if kind == "latest":
        return VersionPolicy("latest", num_versions=proto.latest.num_versions or 1)
    return VersionPolicy()

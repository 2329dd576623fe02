"""A published version's `manifest.json`: one typed record (`VersionManifest`), its one writer and its one reader.

A version folder (`<repository>/<model>/<version>/`, or its bucket prefix) holds its files and `manifest.json`,
written last. The manifest is the published contract: `files` lists every other file with its sha256 (hex) and
size (bytes); `artifacts` lists every artifact with its outcome (`published` or `left out`, the stage and reason),
its file, the serving backend that runs it, its tolerance family (`float32`, `float16`, `dynamic_range`, `int8`),
the signatures its files answer, and its file's size and sha256. Everything else (`signature_def`, `parity`,
`serve_check`, `libraries`, ...) is the run's evidence, kept as JSON values.

The publish stage builds it (`pipeline.orchestration.publish_stage`), the local and bucket publishers complete and
write it (`to_json`), and every reader parses it here (`from_json` / `read`): the bucket mirror
(`serving.storage.mirror`), `--artifact` (`serving.runtimes.published`), the run records and `tfship inspect`.
Manifests written before a field existed still read: every field but `files` has a default, and an artifact's
size and sha256 are taken from its `files` row when the row does not give them. Keys this class does not know are
kept (`extra="allow"`) and written back unchanged.

A manifest that does not parse, or whose fields have the wrong type or value, is refused with a `ManifestError`
naming the file and the field (`artifacts.2.status`), as pydantic locates it.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypeGuard

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from tfship.core.errors import ConfigError
from tfship.core.files import write_json_atomic

MANIFEST_FILE = "manifest.json"
PUBLISHED = "published"
LEFT_OUT = "left out"
ERRORS_SHOWN = 3  # a refused manifest's message names at most this many fields


class ManifestError(ConfigError):
    """A `manifest.json` that is missing, does not parse, or has a field of the wrong type or value."""


class _Entry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")


class FileEntry(_Entry):
    """One file of the version: its path relative to the version folder (POSIX), sha256 (64 hex) and size."""

    path: StrictStr
    sha256: StrictStr = Field(pattern=r"^[0-9a-f]{64}$")
    size_bytes: StrictInt = Field(ge=0)

    @field_validator("path")
    @classmethod
    def _inside_version(cls, value: str) -> str:
        path = PurePosixPath(value)
        if not value or path.is_absolute() or ".." in path.parts or "\\" in value or path.name == MANIFEST_FILE:
            raise ValueError(f"{value[:200]!r} is not a relative path inside the version")
        return value


class ArtifactEntry(_Entry):
    """One artifact of the version and its outcome.

    Attributes:
        artifact: its name (`saved_model`, `onnx`, `tflite_int8`, ...).
        status: `published` (passed the gate, in the version) or `left out`.
        stage, reason: the stage that left it out and a one-line reason ("" when published).
        file: its main file, relative to the version folder (`model_int8.tflite`).
        required: a failure of it fails the run (`convert.required`).
        reason_file: the run folder's file holding the whole reason ("" when none).
        backend: the serving runtime that runs it (`tflite`), "" when none serves it (TF.js) or not recorded.
        family: its tolerance family at the parity gate (`int8`), "" when not recorded.
        signatures: the signatures its files answer (empty when not recorded).
        size_bytes, sha256: its file's, from `files` (None / "" when the file is not listed).
    """

    artifact: StrictStr = Field(min_length=1)
    status: Literal["published", "left out"]
    stage: StrictStr = ""
    reason: StrictStr = ""
    file: StrictStr = ""
    required: bool = False
    reason_file: StrictStr = ""
    backend: StrictStr = ""
    family: StrictStr = ""
    signatures: tuple[StrictStr, ...] = ()
    size_bytes: StrictInt | None = None
    sha256: StrictStr = ""

    @property
    def published(self) -> bool:
        return self.status == PUBLISHED


class VersionManifest(_Entry):
    """The typed `manifest.json` (see the module docstring). Build it, then `with_files` and `stamped` when
    publishing; `to_json` / `write` to store it; `from_json` / `read` to read one back.
    """

    status: StrictStr = ""
    artifacts: tuple[ArtifactEntry, ...] = ()
    run: StrictStr = ""
    git_commit: StrictStr = ""
    signature_def: dict[str, Any] = Field(default_factory=dict)
    signatures: dict[str, Any] = Field(default_factory=dict)
    class_names: tuple[str, ...] = ()
    data: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    parity: dict[str, Any] = Field(default_factory=dict)
    audit: dict[str, Any] = Field(default_factory=dict)
    # Ops the op policy (`core.op_policy`) allowed at publish (`export.allow_ops`): the operator's allowance, on
    # record. A server never reads it as its own: only its --allow-ops flag allows an op there.
    allowed_ops: tuple[StrictStr, ...] = ()
    serve_check: dict[str, Any] = Field(default_factory=dict)
    conversions: list[Any] = Field(default_factory=list)
    libraries: dict[str, Any] = Field(default_factory=dict)
    model_name: StrictStr = ""
    version: StrictInt | None = None
    repository: StrictStr = ""
    published_at: StrictStr = ""
    files: tuple[FileEntry, ...]

    @model_validator(mode="before")
    @classmethod
    def _fill_from_files(cls, payload: Any) -> Any:
        """An artifact row without size or sha256 (manifests written before they were) takes its file's row."""
        if not _is_object(payload) or not isinstance(payload.get("files"), list | tuple) or \
                not isinstance(payload.get("artifacts"), list | tuple):
            return payload
        listed = {row.get("path"): row for row in payload["files"] if _is_object(row)}
        rows: list[Any] = []
        for row in payload["artifacts"]:
            entry = listed.get(row.get("file")) if _is_object(row) else None
            if entry is not None and "sha256" not in row and "size_bytes" not in row:
                row = {**row, "sha256": entry.get("sha256", ""), "size_bytes": entry.get("size_bytes")}
            rows.append(row)
        return {**payload, "artifacts": rows}

    @model_validator(mode="after")
    def _agrees_with_files(self) -> VersionManifest:
        """An artifact's size and sha256 are its file's, as `files` lists it."""
        listed = {row.path: row for row in self.files}
        for index, row in enumerate(self.artifacts):
            entry = listed.get(row.file)
            if entry is not None and row.sha256 and (row.sha256, row.size_bytes) != (entry.sha256, entry.size_bytes):
                raise ValueError(f"artifacts.{index}: {row.artifact}'s size/sha256 ({row.size_bytes}, "
                                 f"{row.sha256[:16]}...) differ from files' row for {row.file!r} "
                                 f"({entry.size_bytes}, {entry.sha256[:16]}...)")
        return self

    def artifact(self, name: str) -> ArtifactEntry | None:
        """The row of artifact `name`, or None when the manifest does not list it."""
        return next((row for row in self.artifacts if row.artifact == name), None)

    def published_names(self) -> list[str]:
        """The artifacts listed as published, sorted."""
        return sorted(row.artifact for row in self.artifacts if row.published)

    def file(self, path: str) -> FileEntry | None:
        """The `files` row of `path` (relative to the version folder), or None."""
        return next((row for row in self.files if row.path == path), None)

    def with_files(self, files: list[dict[str, Any]] | tuple[FileEntry, ...]) -> VersionManifest:
        """This manifest listing `files` (rows with path, sha256, size_bytes; `manifest.json` itself left out),
        each artifact's size and sha256 taken from its file's row.

        Raises:
            ManifestError: a row is malformed (naming the field).
        """
        rows = [row if isinstance(row, FileEntry) else FileEntry.model_validate(row) for row in files
                if (row.path if isinstance(row, FileEntry) else row.get("path")) != MANIFEST_FILE]
        listed = {row.path: row for row in rows}
        artifacts = tuple(row.model_copy(update={"size_bytes": listed[row.file].size_bytes,
                                                 "sha256": listed[row.file].sha256})
                          if row.file in listed else row for row in self.artifacts)
        return self.model_copy(update={"files": tuple(rows), "artifacts": artifacts})

    def stamped(self, **fields: Any) -> VersionManifest:
        """A copy with publish-time fields set (`model_name`, `version`, `published_at`, `repository`), checked."""
        return type(self).model_validate(self.to_json() | fields)

    def to_json(self) -> dict[str, Any]:
        """The JSON object written as `manifest.json` (unknown keys read in are kept)."""
        return self.model_dump(mode="json")

    def to_bytes(self) -> bytes:
        """`manifest.json`'s bytes (UTF-8, indented), as the bucket publisher uploads them."""
        return (json.dumps(self.to_json(), indent=2) + "\n").encode("utf-8")

    def write(self, version_dir: Path) -> Path:
        """Write `<version_dir>/manifest.json` atomically (a temporary sibling renamed into place)."""
        return write_json_atomic(Path(version_dir) / MANIFEST_FILE, self.to_json())

    @classmethod
    def from_json(cls, payload: dict[str, Any] | str | bytes, source: str | Path = MANIFEST_FILE) -> VersionManifest:
        """Parse a manifest: a JSON object, or its text or bytes.

        Args:
            payload: the manifest.
            source: where it came from, for messages (a file path or `s3://...` key).

        Raises:
            ManifestError: not JSON, not an object, or fields of the wrong type or value; the message names
                `source` and each field (`artifacts.1.status`), at most `ERRORS_SHOWN` of them.
        """
        if isinstance(payload, str | bytes):
            try:
                payload = json.loads(payload)
            except ValueError as err:
                raise ManifestError(f"{source}: not valid JSON ({err})") from err
        if not isinstance(payload, dict):
            raise ManifestError(f"{source}: a manifest is a JSON object, got {type(payload).__name__}")
        try:
            return cls.model_validate(payload)
        except ValidationError as err:
            raise ManifestError(f"{source}: {_describe(err)}") from err

    @classmethod
    def read(cls, version_dir: Path) -> VersionManifest:
        """`<version_dir>/manifest.json`, parsed (`version_dir` may also be the manifest's own path).

        Raises:
            ManifestError: it is missing or unreadable, or refused by `from_json`.
        """
        path = Path(version_dir)
        path = path if path.name == MANIFEST_FILE and not path.is_dir() else path / MANIFEST_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise ManifestError(f"{path} does not exist (not a version published by tfship)") from None
        except OSError as err:
            raise ManifestError(f"{path}: cannot read it ({err})") from err
        return cls.from_json(raw, path)


def _is_object(value: Any) -> TypeGuard[dict[str, Any]]:
    """A JSON object (a dict: its keys are strings)."""
    return isinstance(value, dict)


def _describe(err: ValidationError) -> str:
    """`field 'a.0.b': message (got value)` for the first `ERRORS_SHOWN` errors."""
    parts: list[str] = []
    for error in err.errors()[:ERRORS_SHOWN]:
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        given = error.get("input")
        shown = "" if isinstance(given, dict | list) else f" (got {str(given)[:80]!r})"
        parts.append(f"field {where!r}: {error['msg']}{shown}")
    more = err.error_count() - ERRORS_SHOWN
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")

"""The conversion registry: every artifact format the pipeline converts, collected from the format packages.

Each format package exports `FORMATS`, a tuple of `core.formats.ArtifactFormat` (spec, converter, peak-memory
model, enable key, signature files); `FORMAT_PACKAGES` below is the one list of those packages, in conversion
order. The convert stage, the memory budget, the parity gate, the serve-check, `convert.required`, the reports
and the manifest read everything about a format from its `ArtifactFormat`, by name. Adding a format is a package
of its own exporting `FORMATS` and one line in `FORMAT_PACKAGES` (docs/architecture.md, "An artifact kind").

`register_format` adds one more at run time (a plug-in outside this repository, or a test's toy format).
"""

from __future__ import annotations

from tfship.core.errors import ConfigError
from tfship.core.formats import Artifact, ArtifactFormat
from tfship.onnx_format import formats as onnx_formats
from tfship.tfjs import formats as tfjs_formats
from tfship.tflite import formats as tflite_formats

# The format packages, in conversion (and report) order: one line per package.
FORMAT_PACKAGES = (
    onnx_formats,
    tflite_formats,
    tfjs_formats,
)
SAVED_MODEL = "saved_model"  # the reference every format is proven against; reserved, never a registered format
ARTIFACT_KINDS: dict[str, ArtifactFormat] = {}


def register_format(spec: ArtifactFormat) -> ArtifactFormat:
    """Add an artifact format; a name registered twice, or the reserved `saved_model`, is refused.

    Raises:
        ConfigError: the name is taken.
    """
    if spec.name in ARTIFACT_KINDS or spec.name == SAVED_MODEL:
        raise ConfigError(f"artifact kind {spec.name!r} is already registered")
    ARTIFACT_KINDS[spec.name] = spec
    return spec


def unregister_format(name: str) -> None:
    """Remove a format registered with `register_format` (a test's toy format); unknown names are ignored."""
    ARTIFACT_KINDS.pop(name, None)


def artifact_kinds() -> dict[str, ArtifactFormat]:
    """Every registered format by name, in registration order."""
    return ARTIFACT_KINDS


def format_of(name: str) -> ArtifactFormat | None:
    """The registered format called `name`; None for `saved_model` or an unknown name."""
    return ARTIFACT_KINDS.get(name)


def format_for(artifact: Artifact) -> ArtifactFormat | None:
    """The format of `artifact`: the registered format of its name when that format's backend is the artifact's,
    else the first registered format its backend serves (an artifact named otherwise, e.g. in a benchmark), else
    None (the SavedModel, or a backend no format names).
    """
    spec = ARTIFACT_KINDS.get(artifact.name)
    if spec is not None and spec.backend == artifact.kind:
        return spec
    return next((s for s in ARTIFACT_KINDS.values() if s.backend and s.backend == artifact.kind), None)


def check_required(settings) -> None:
    """Refuse a `convert.formats` or `convert.required` entry that names no registered format, or a required format
    the config does not enable.

    Raises:
        ConfigError: naming the key, the value and the known artifacts (or the key that enables it).
    """
    for name in settings.formats:
        if name not in ARTIFACT_KINDS:
            raise ConfigError(f"key 'convert.formats': unknown artifact format {name!r}; registered: "
                              f"{list(ARTIFACT_KINDS)}")
    for name in settings.required:
        if name == SAVED_MODEL:
            continue
        if name not in ARTIFACT_KINDS:
            raise ConfigError(f"key 'convert.required': unknown artifact {name!r}; known: "
                              f"{[SAVED_MODEL, *ARTIFACT_KINDS]}")
        spec = ARTIFACT_KINDS[name]
        if not spec.enabled(settings):
            wanted = f"list {spec.enable_value!r} in" if spec.enable_value is not None else "set"
            raise ConfigError(f"key 'convert.required': artifact {name!r} is required but not enabled "
                              f"({wanted} {spec.enable_setting})")


def enabled_kinds(settings) -> list[ArtifactFormat]:
    """The formats the `[convert]` section enables, in registration order."""
    return [spec for spec in ARTIFACT_KINDS.values() if spec.enabled(settings)]


def known_artifact_names() -> tuple[str, ...]:
    """`saved_model` and every registered format's name (what `convert.required` may list)."""
    return (SAVED_MODEL, *ARTIFACT_KINDS)


for _package in FORMAT_PACKAGES:
    for _spec in _package.FORMATS:
        register_format(_spec)

__all__ = ["ARTIFACT_KINDS", "FORMAT_PACKAGES", "SAVED_MODEL", "artifact_kinds", "check_required",
           "enabled_kinds", "format_for", "format_of", "known_artifact_names", "register_format", "unregister_format"]

"""Version folders on disk, as TF Serving reads them: `<base_path>/<int>/`, which names are versions, a folder's
fingerprint (to retry a failed load only once it changed), and the check of a whole config against the disk
(`check_config`) before the model manager applies any of it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tfship.core.errors import ConfigError
from tfship.core.locations import BucketUrl
from tfship.serving.dataplane.model_config import ModelConfig

log = logging.getLogger(__name__)


def check_config(configs: list[ModelConfig]) -> None:
    """Check every model of a new config against the disk before any of it is applied.

    Each `base_path` must be a folder with at least one version the policy selects; `specific` versions
    and `version_labels` must name versions present on disk (and, for labels, selected by the policy).

    Raises:
        ConfigError: naming the model, the field and the value.
    """
    for config in configs:
        where = f"model {config.name!r}"
        if isinstance(config.base_path, BucketUrl):
            continue  # checked once mirrored (apply_config checks the localized config)
        if not config.base_path.is_dir():
            what = "is not a folder" if config.base_path.exists() else "does not exist"
            raise ConfigError(f"{where}: base_path {str(config.base_path)!r} {what}")
        on_disk = versions_on_disk(config.base_path)
        if not on_disk:
            raise ConfigError(f"{where}: base_path {str(config.base_path)!r} holds no version folder "
                              "(<base_path>/<positive integer>/)")
        missing = sorted(set(config.policy.versions) - set(on_disk))
        if config.policy.kind == "specific" and missing:
            raise ConfigError(f"{where}: model_version_policy.specific.versions {missing} not found under "
                              f"{str(config.base_path)!r}; versions on disk: {on_disk}")
        selected = config.policy.select(on_disk)
        for label, version in sorted(config.labels.items()):
            if version not in selected:
                raise ConfigError(f"{where}: version_labels {{{label!r}: {version}}} points at a version that "
                                  f"is not served; served versions: {selected}")


def fingerprint(path: Path) -> tuple:
    """(relative path, size, mtime_ns) of every file under `path`: changes when a copy progresses or is replaced."""
    entries = []
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            try:
                stat = os.stat(full)
            except OSError:  # removed while walking: the next poll sees the new state
                continue
            entries.append((os.path.relpath(full, path), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(entries))


MAX_VERSION = (1 << 63) - 1  # TF Serving's versions are int64


def version_of(folder_name: str) -> int | None:
    """The version a folder name stands for, as TF Serving parses it: ASCII digits only, in [1, 2^63-1]
    (`0001` is version 1). Any other name (`v2`, `.tmp3`, `.staging-4`, `²`, fullwidth digits) is None.
    """
    if not (folder_name.isascii() and folder_name.isdigit()):
        return None
    version = int(folder_name)
    return version if 1 <= version <= MAX_VERSION else None


def version_folders(base_path: Path) -> dict[int, Path]:
    """Version -> folder under `base_path` (TF Serving's version folders). Never raises: an unreadable or
    vanishing entry is skipped (the next poll sees it again). When two names give one version (`1`, `0001`)
    the shortest name wins, with a warning.
    """
    found: dict[int, Path] = {}
    try:
        entries = list(os.scandir(base_path))
    except OSError:
        return found
    for entry in entries:
        version = version_of(entry.name)
        try:
            if version is None or not entry.is_dir():
                continue
        except OSError:
            continue
        other = found.get(version)
        if other is not None:
            log.warning("folders %s and %s are both version %d under %s; serving %s", other.name, entry.name,
                        version, base_path, min(other.name, entry.name, key=lambda n: (len(n), n)))
            if (len(other.name), other.name) <= (len(entry.name), entry.name):
                continue
        found[version] = Path(entry.path)
    return found


def versions_on_disk(base_path: Path) -> list[int]:
    """Versions present under `base_path`, ascending."""
    return sorted(version_folders(base_path))

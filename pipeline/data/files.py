"""File sets of the streaming sources: globs expanded, each file checked readable, compression chosen.

A glob that matches nothing or a file that cannot be opened is a `DatasetError` naming it, raised
before any record is read (so a run stops before it writes anything).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from tfship.core.errors import DatasetError

# TFRecordDataset's `compression_type` of one file: "" (none), "GZIP" or "ZLIB".
Compression = Literal["", "GZIP", "ZLIB"]
GZIP_SUFFIXES = (".gz", ".gzip")
ZLIB_SUFFIXES = (".zz", ".zlib")


def expand(patterns: Sequence[Path | str] | Path | str, what: str) -> tuple[str, ...]:
    """The sorted, de-duplicated files matching one or several glob patterns (`tf.io.gfile.glob`).

    Args:
        patterns: a file, a glob pattern, or several.
        what: the config key named in errors (`data.path`, `data.train_path`, ...).

    Returns:
        file names, sorted (the order every pipeline and the split are built on).

    Raises:
        DatasetError: a pattern matches nothing, or a matched file cannot be opened for reading.
    """
    import tensorflow as tf

    listed = [str(p) for p in ([patterns] if isinstance(patterns, (str, Path)) else patterns)]
    files: set[str] = set()
    for pattern in listed:
        try:
            found = tf.io.gfile.glob(pattern)
        except tf.errors.OpError as err:
            raise DatasetError(f"{what}: {pattern}: cannot list files: {err.message.splitlines()[0]}") from err
        if not found:
            raise DatasetError(f"{what}: {pattern}: the pattern matches no file")
        files.update(f for f in found if not tf.io.gfile.isdir(f))
    if not files:
        raise DatasetError(f"{what}: {', '.join(listed)}: the pattern matches only folders, no file")
    for file in files:
        _check_readable(file)
    return tuple(sorted(files))


def _check_readable(file: str) -> None:
    try:
        with open(file, "rb") as handle:
            handle.read(1)
    except OSError as err:
        raise DatasetError(f"{file}: unreadable file: {err.strerror or err}") from err
    if not os.access(file, os.R_OK):
        raise DatasetError(f"{file}: unreadable file: permission denied")


def compression_of(file: str, setting: str) -> Compression:
    """TFRecordDataset's `compression_type` for `file`: "" (none), "GZIP" or "ZLIB".

    `setting` "auto" follows the suffix (*.gz / *.gzip: GZIP; *.zz / *.zlib: ZLIB; else none).
    """
    if setting == "none":
        return ""
    if setting in ("GZIP", "ZLIB"):
        return setting
    lower = file.lower()
    if lower.endswith(GZIP_SUFFIXES):
        return "GZIP"
    if lower.endswith(ZLIB_SUFFIXES):
        return "ZLIB"
    return ""

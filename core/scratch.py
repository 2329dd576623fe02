"""Temporary folders that a killed process does not leave behind for good.

Every temporary folder tfship makes is `tfship-<kind>-*` in the temp directory (`tempfile.gettempdir()`,
`TMPDIR`), made by `make_scratch`, which writes the owner's pid into it (`owner.pid`) before anything else.

* A process that ends normally removes its folders: `scratch_folder` on leaving its `with` block, and
  `remove_own_scratch` for any still there, run at interpreter exit (`atexit`) and by the paths that end the
  process with `os._exit`, which runs no `atexit` hook (`tfship serve` after draining, a failed multi-worker
  training process).
* A process killed by SIGKILL (or by the OOM killer) cannot; `remove_orphaned_scratch`, run when `tfship`,
  `python -m tfship.serving` or `tensorflow_model_server` starts and when a `--num-processes` or `--workers`
  launcher starts, removes every `tfship-*` folder whose owner no longer runs.

A folder without a readable `owner.pid` is left alone: one being made right now, one of an older tfship, or
someone else's. A pid reused by a new process keeps its folder until that process ends too (a folder is never
removed from under a live process). Folders may hold secrets (the PEM files of TF Serving's
`--ssl_config_file`), so they are 0700 (`mkdtemp`).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tfship.core.processes import pid_alive

log = logging.getLogger(__name__)

SCRATCH_PREFIX = "tfship-"
OWNER_FILE = "owner.pid"
_LEGACY_OWNER_FILE = "parent.pid"  # written by the `--num-processes` parent before this module existed
_own: list[Path] = []  # made by this process and not removed yet


def make_scratch(kind: str) -> Path:
    """A new 0700 folder `tfship-<kind>-XXXXXXXX` in the temp directory, marked as this process's.

    Remove it with `remove_scratch` (or use `scratch_folder`); otherwise it goes at exit. Raises OSError when
    the temp directory cannot be written.
    """
    folder = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{kind}-"))
    marker = folder / f".{OWNER_FILE}.tmp"
    marker.write_text(str(os.getpid()))
    os.replace(marker, folder / OWNER_FILE)  # a reader sees no pid or the whole pid
    _own.append(folder)
    return folder


def remove_scratch(folder: Path) -> None:
    """Delete `folder` (made by `make_scratch`) and everything in it; a folder already gone is fine."""
    shutil.rmtree(folder, ignore_errors=True)
    if folder in _own:
        _own.remove(folder)


@contextmanager
def scratch_folder(kind: str) -> Iterator[Path]:
    """A `make_scratch` folder of `kind` for the length of a `with` block, removed when the block ends."""
    folder = make_scratch(kind)
    try:
        yield folder
    finally:
        remove_scratch(folder)


def remove_own_scratch() -> None:
    """Delete every folder this process made and has not removed (before `os._exit`; also run at exit)."""
    for folder in list(_own):
        remove_scratch(folder)


atexit.register(remove_own_scratch)


def _owner(folder: Path) -> int | None:
    for name in (OWNER_FILE, _LEGACY_OWNER_FILE):
        try:
            return int((folder / name).read_text())
        except (OSError, ValueError):
            continue
    return None


def remove_orphaned_scratch(root: Path | None = None) -> list[Path]:
    """Delete the `tfship-*` folders in `root` (default: the temp directory) whose owner process is dead.

    Returns the folders removed, each logged at INFO. Never raises: a folder that cannot be read or removed is
    skipped.
    """
    removed = []
    try:
        candidates = sorted(Path(root or tempfile.gettempdir()).glob(SCRATCH_PREFIX + "*"))
    except OSError:
        return removed
    for folder in candidates:
        pid = _owner(folder) if folder.is_dir() and not folder.is_symlink() else None
        if pid is None or pid == os.getpid() or pid_alive(pid):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            removed.append(folder)
            log.info("removed %s, left by process %d that no longer runs", folder, pid)
    return removed

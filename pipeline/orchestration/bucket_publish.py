"""Publish a version into a bucket so that no server can ever load part of one.

Object stores have no atomic rename, so a version becomes visible in steps, each checked:

1. every file is uploaded under `<model>/.staging-<host>-<pid>-<token>/` and its size checked (and its MD5
   against the ETag where the store reports one for a single-part upload);
2. the next free version number is claimed with `<model>/<N>/.claim-<token>` (a version with a claim but no
   manifest is in progress, never served);
3. the files are copied server-side to `<model>/<N>/` and checked again;
4. `manifest.json`, holding every file's sha256 and size, is written **last**: it is the completion marker.
   Servers (`serving.storage.mirror`) serve only versions whose manifest is there, and verify every file
   against it before the version leaves their cache's partial folder.

A publish killed at any step leaves a staging prefix or a version without a manifest; the next publish removes
those whose publisher is gone (same host, pid not alive) or that are older than `STALE_S`.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import socket
import time
from pathlib import Path

from tfship.core.errors import StageError
from tfship.core.locations import BucketUrl
from tfship.core.manifest import VersionManifest
from tfship.core.processes import pid_alive
from tfship.serving.storage.filesystem import key_path, open_filesystem
from tfship.serving.storage.mirror import MARKER
from tfship.serving.storage.signed import SIGNATURE_FILE, SignatureError, sign_version

STALE_S = 3600.0  # a staging prefix or unfinished version older than this has no live publisher


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_object(fs, key: str, local: Path) -> None:
    """Raise StageError unless the object `key` has `local`'s size (and MD5, where the ETag is one)."""
    info = fs.info(key, refresh=True)
    size = local.stat().st_size
    if info.get("size") != size:
        raise StageError(f"publish: s3://{key} is {info.get('size')} bytes after upload, the file is {size}")
    etag = str(info.get("ETag", "")).strip('"')
    if etag and "-" not in etag and len(etag) == 32 and etag != _md5(local):
        raise StageError(f"publish: s3://{key} has ETag {etag}, the file's MD5 is {_md5(local)}")


def _versions(fs, base: str) -> dict[int, str]:
    try:
        entries = fs.ls(base, detail=False, refresh=True)
    except FileNotFoundError:
        return {}
    return {int(e.rstrip("/").rsplit("/", 1)[-1]): e for e in entries
            if e.rstrip("/").rsplit("/", 1)[-1].isdigit()}


def _dead(name: str, newest_mtime: float | None) -> bool:
    """Whether a `.staging-<host>-<pid>-<token>` or `.claim-…` object has no live publisher."""
    parts = name.split("-")
    if len(parts) >= 4 and parts[1] == socket.gethostname() and parts[2].isdigit():
        return not pid_alive(int(parts[2]))
    return newest_mtime is not None and time.time() - newest_mtime > STALE_S


def _newest(fs, prefix: str) -> float | None:
    stamps = []
    for info in fs.find(prefix, detail=True).values():
        modified = info.get("LastModified")
        if modified is not None:
            stamps.append(modified.timestamp())
    return max(stamps) if stamps else None


def remove_stale(fs, base: str) -> list[str]:
    """Delete staging prefixes and unfinished versions (no manifest) of publishers that are gone."""
    removed = []
    try:
        entries = fs.ls(base, detail=False, refresh=True)
    except FileNotFoundError:
        return removed
    for entry in entries:
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if name.startswith(".staging-") and _dead(name.removeprefix("."), _newest(fs, entry)):
            fs.rm(entry, recursive=True)
            removed.append(entry)
        elif name.isdigit() and not fs.exists(f"{entry}/{MARKER}"):
            claims = [c.rsplit("/", 1)[-1] for c in fs.ls(entry, detail=False) if "/.claim-" in c]
            if all(_dead(c.removeprefix("."), _newest(fs, entry)) for c in claims) and (
                    claims or _dead("", _newest(fs, entry))):
                fs.rm(entry, recursive=True)
                removed.append(entry)
    return removed


def _signature(candidate_dir: Path, files: list[Path], final: VersionManifest, signing_key: Path) -> bytes:
    """`model.sig`'s bytes for the version as the bucket will hold it: the candidate's files (hard links, or
    copies across file systems) and `final`'s bytes, signed in a sibling folder that is removed after.

    Raises:
        StageError: the signing failed (the key, the extra).
    """
    folder = candidate_dir.parent / f".signing-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        for path in files:
            dest = folder / path.relative_to(candidate_dir)
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, dest)
            except OSError:
                shutil.copy2(path, dest)
        (folder / MARKER).write_bytes(final.to_bytes())
        return sign_version(folder, signing_key).read_bytes()
    except SignatureError as err:
        raise StageError(f"publish: {err}; nothing was published") from err
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def publish_to_bucket(candidate_dir: Path, repository: BucketUrl, model_name: str, manifest: VersionManifest,
                      signing_key: Path | None = None) -> tuple[int, BucketUrl, VersionManifest]:
    """Upload `candidate_dir` (a checked version folder holding `manifest.json`) as the next version of
    `model_name` under `repository`; returns (version, its URL, the manifest written: `manifest` with
    `model_name`, `version` and `repository` set; its `files` must already list the candidate's files).
    With `signing_key`, `model.sig` (over the files and the manifest's very bytes, `serving.storage.signed`) is
    uploaded before the manifest, so a complete version is a signed one.

    Raises:
        StageError: an upload or check failed; no manifest was written, so no server serves the version.
    """
    fs = open_filesystem(repository)
    base = key_path(repository / model_name)
    remove_stale(fs, base)
    token = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    staging = f"{base}/.staging-{token}"
    files = [p for p in sorted(candidate_dir.rglob("*")) if p.is_file() and p.name != MARKER
             and p != candidate_dir / SIGNATURE_FILE]
    try:
        for path in files:
            key = f"{staging}/{path.relative_to(candidate_dir).as_posix()}"
            fs.put_file(str(path), key)
            _check_object(fs, key, path)
        for _attempt in range(5):
            taken = _versions(fs, base)
            version = max(taken, default=0) + 1
            claim = f"{base}/{version}/.claim-{token}"
            fs.pipe_file(claim, b"")
            others = [c for c in fs.ls(f"{base}/{version}", detail=False, refresh=True) if not c.endswith(claim)]
            if not others:
                break
            fs.rm(claim)  # another publisher claimed the same number at the same moment: take the next
        else:
            raise StageError(f"publish: could not claim a free version number under s3://{base}")
        target = f"{base}/{version}"
        for path in files:
            relative = path.relative_to(candidate_dir).as_posix()
            fs.copy(f"{staging}/{relative}", f"{target}/{relative}")
            _check_object(fs, f"{target}/{relative}", path)
        final = manifest.stamped(model_name=model_name, version=version, repository=str(repository))
        if signing_key is not None:
            fs.pipe_file(f"{target}/{SIGNATURE_FILE}", _signature(candidate_dir, files, final, signing_key))
        fs.pipe_file(f"{target}/{MARKER}", final.to_bytes())  # last: the version is complete
        fs.rm(claim)
        return version, repository / model_name / str(version), final
    except StageError:
        raise
    except Exception as err:
        raise StageError(f"publish: uploading to s3://{base} failed: {type(err).__name__}: "
                         f"{str(err).splitlines()[0][:300] if str(err) else ''}") from err
    finally:
        try:
            fs.rm(staging, recursive=True)
        except FileNotFoundError:
            pass

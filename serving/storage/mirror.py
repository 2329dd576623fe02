"""Serve from a bucket exactly as from a folder: complete versions are mirrored into a local cache, atomically.

Bucket layout (what `tfship publish --repository s3://…` writes): `<base>/<version>/…` with the version's
`manifest.json` written **last**. The manifest's `files` list every other file with its sha256 and size. A version
is complete, and may be served, only when its manifest is there; a version is fetched into
`<cache>/<slug>/.partial-<version>-<pid>-<token>/`, every file checked against the manifest (size and sha256),
then renamed to `<cache>/<slug>/<version>/` in one step, with the version's `model.sig` when it has one and the
manifest's own bytes (what a signature covers; `--verify-key` checks the local copy before it loads). The model
manager only ever sees that local folder, so every rule of local serving holds unchanged: version-folder names,
version policies, polling, hot reload, and "a failed load keeps the old version".

A version whose files are missing or differ from its manifest is refused (logged once, naming the object) and
not retried until its manifest changes; the versions already cached keep serving. The cache holds only the
versions the policy selects (plus labelled ones): others are deleted at each sync, as are partial folders of
processes that are gone. An unreachable bucket raises, so the poll fails and nothing local is removed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tfship.core.locations import BucketUrl
from tfship.core.manifest import MANIFEST_FILE, ManifestError, VersionManifest
from tfship.core.processes import pid_alive
from tfship.serving.storage.filesystem import key_path, open_filesystem
from tfship.serving.storage.signed import MIRROR_DIGEST_FILE, SIGNATURE_FILE

log = logging.getLogger(__name__)

MARKER = MANIFEST_FILE
DIGEST_FILE = MIRROR_DIGEST_FILE  # in each cached version: which publish of that version it holds (never signed)


class VersionCorruptError(Exception):
    """A version's objects do not match its manifest (missing, wrong size or wrong sha256)."""


@dataclass(frozen=True)
class RemoteVersion:
    """A complete version in the bucket: its number, its manifest and the manifest's sha256 (its identity)."""

    version: int
    manifest: VersionManifest
    digest: str


def default_cache_root() -> Path:
    """`$TFSHIP_MODEL_CACHE_DIR`, else `<temp>/tfship-model-cache-<uid>`."""
    configured = os.environ.get("TFSHIP_MODEL_CACHE_DIR")
    return Path(configured) if configured else Path(tempfile.gettempdir()) / f"tfship-model-cache-{os.getuid()}"


def _slug(url: BucketUrl) -> str:
    readable = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{url.bucket}_{url.key}")[-80:]
    return f"{readable}-{hashlib.sha256(url.encode()).hexdigest()[:10]}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()



class BucketMirror:
    """The local copy of one bucket base path (`s3://bucket/models/<model>`).

    Args:
        url: the model's base path in the bucket (its version prefixes are `url/<int>/`).
        cache_root: the cache folder shared by every mirror of this server.
        filesystem: an fsspec filesystem; default `open_filesystem(url)` (s3fs).
    """

    def __init__(self, url: BucketUrl, cache_root: Path, filesystem=None) -> None:
        self.url = url
        self.local = Path(cache_root) / _slug(url)
        self._fs = filesystem
        self._refused: dict[int, str] = {}  # version -> digest of the manifest whose objects did not match

    @property
    def fs(self):
        if self._fs is None:
            self._fs = open_filesystem(self.url)
        return self._fs

    def complete_versions(self) -> dict[int, RemoteVersion]:
        """Versions under `url` whose manifest (the completion marker) is present and well formed.

        Raises:
            OSError (and botocore's errors): the bucket could not be listed.
        """
        base = key_path(self.url)
        try:
            entries = self.fs.ls(base, detail=False, refresh=True)
        except FileNotFoundError:
            return {}
        found = {}
        for entry in entries:
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if not name.isdigit() or int(name) <= 0:
                continue  # staging prefixes, promotion records and other names are not versions
            try:
                raw = self.fs.cat_file(f"{base}/{name}/{MARKER}")
            except FileNotFoundError:
                continue  # no marker: an upload in progress or a killed one
            try:
                manifest = VersionManifest.from_json(raw, f"{self.url}/{name}/{MARKER}")
            except ManifestError as err:
                log.error("%s/%s/%s is not a usable manifest (%s); version not served", self.url, name, MARKER,
                          str(err)[:300])
                continue
            found[int(name)] = RemoteVersion(int(name), manifest, hashlib.sha256(raw).hexdigest())
        return found

    def sync(self, select: Callable[[list[int]], Iterable[int]]) -> Path:
        """Make the cache hold exactly the complete versions `select` picks (a version policy); returns the
        local base path to serve. A version that fails verification is left out and `select` asked again
        without it, so an older cached version keeps serving.
        """
        self.local.mkdir(parents=True, exist_ok=True)
        self._remove_dead_partials()
        remote = self.complete_versions()
        while True:
            usable = sorted(v for v, rv in remote.items() if self._refused.get(v) != rv.digest)
            wanted = set(select(usable))
            failed = [v for v in sorted(wanted, reverse=True) if not self._ensure(remote[v])]
            if not failed:
                break
        for path in self.local.iterdir():
            if path.name.isdigit() and int(path.name) not in wanted:
                shutil.rmtree(path, ignore_errors=True)  # deselected or gone from the bucket: the cache stays bounded
        return self.local

    def _ensure(self, remote: RemoteVersion) -> bool:
        """The cached copy of `remote` is present (fetched now if missing or from another publish)."""
        target = self.local / str(remote.version)
        held = target / DIGEST_FILE
        cached = held.is_file() and held.read_text() == remote.digest and (target / MARKER).is_file()
        if cached and _sha256(target / MARKER) == remote.digest:  # (a cache whose manifest was rewritten is
            return True                                           # fetched again: a signature covers its bytes)
        partial = self.local / f".partial-{remote.version}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            self._fetch(remote, partial)
            if target.exists():
                shutil.rmtree(target)  # the bucket holds a different publish of this number now
            os.replace(partial, target)
            log.info("%s/%d fetched into %s (%d files, verified)", self.url, remote.version, target,
                     len(remote.manifest.files))
            return True
        except (VersionCorruptError, FileNotFoundError) as err:
            self._refused[remote.version] = remote.digest
            log.error("%s/%d is not served: %s", self.url, remote.version, str(err)[:300])
            return False
        except OSError as err:
            if target.is_dir() and (target / DIGEST_FILE).is_file():  # another process of this server won
                return (target / DIGEST_FILE).read_text() == remote.digest
            raise OSError(f"fetching {self.url}/{remote.version} failed: {err}") from err
        finally:
            shutil.rmtree(partial, ignore_errors=True)

    def _fetch(self, remote: RemoteVersion, partial: Path) -> None:
        base = f"{key_path(self.url)}/{remote.version}"
        for row in remote.manifest.files:
            dest = partial / row.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.fs.get_file(f"{base}/{row.path}", str(dest))
            except FileNotFoundError as err:
                raise VersionCorruptError(f"{row.path!r} is listed in its manifest but missing") from err
            size = dest.stat().st_size
            if size != row.size_bytes:
                raise VersionCorruptError(f"{row.path!r} is {size} bytes, its manifest says {row.size_bytes}")
            if _sha256(dest) != row.sha256:
                raise VersionCorruptError(f"{row.path!r} does not match the sha256 in its manifest")
        try:  # a signed version's signature (serving.storage.signed) comes along, checked at load (--verify-key)
            self.fs.get_file(f"{base}/{SIGNATURE_FILE}", str(partial / SIGNATURE_FILE))
        except FileNotFoundError:  # unsigned: refused at load under --verify-key, served otherwise
            (partial / SIGNATURE_FILE).unlink(missing_ok=True)
        raw = self.fs.cat_file(f"{base}/{MARKER}")  # the very bytes a signature covers, not a re-serialisation
        if hashlib.sha256(raw).hexdigest() != remote.digest:
            raise VersionCorruptError(f"{MARKER} changed while the version was fetched")
        (partial / MARKER).write_bytes(raw)
        (partial / DIGEST_FILE).write_text(remote.digest)

    def _remove_dead_partials(self) -> None:
        for path in self.local.glob(".partial-*"):
            parts = path.name.split("-")
            if len(parts) >= 4 and parts[2].isdigit() and not pid_alive(int(parts[2])):
                shutil.rmtree(path, ignore_errors=True)


class BucketMirrors:
    """Every mirror of one server, keyed by bucket base path; turns bucket configs into local ones."""

    def __init__(self, cache_root: Path | None = None) -> None:
        self.cache_root = Path(cache_root) if cache_root else default_cache_root()
        self._mirrors: dict[str, BucketMirror] = {}

    def localize(self, configs: list) -> list:
        """`configs` with each bucket `base_path` synced and replaced by its cache folder (`source` keeps the
        URL); local configs pass through. Raises what `BucketMirror.sync` raises.
        """
        out = []
        for config in configs:
            url = config.source or (config.base_path if isinstance(config.base_path, BucketUrl) else None)
            if url is None:
                out.append(config)
                continue
            mirror = self._mirrors.setdefault(str(url), BucketMirror(url, self.cache_root))
            local = mirror.sync(lambda versions, c=config: _served(c, versions))
            out.append(dataclasses.replace(config, base_path=local, source=url))
        return out


def _served(config, versions: list[int]) -> set[int]:
    """What the model's version policy selects among `versions`, plus the versions its labels name."""
    return set(config.policy.select(versions)) | (set(config.labels.values()) & set(versions))

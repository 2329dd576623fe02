"""Signed versions: `model.sig`, an OpenSSF model-signing signature (EC key mode, offline) over a version folder.

The signature is a Sigstore bundle whose DSSE payload lists the sha256 of every file of the version but itself
(and the bucket mirror's `.tfship-manifest-sha256` bookkeeping file). `manifest.json` is one of those files, and it
names the model and the version, so the signature binds the name, the number and every file's sha256 at once:
`verify_version` checks the folder against the signature, then the signed manifest against the name and number
it is served under (v3 copied into `7/`, model A's version under model B are refused).

Refused, before the library reads a byte: no `model.sig` (unsigned), a symlink or anything but a regular file, a
file with more than one hard link (its content could change through the other name after verification). Then the
library refuses a changed, added or removed file, a signature made with another key or a damaged bundle.

The `model-signing` package is the `signing` extra (`pip install ".[signing]"`): imported only here, only when a
version is signed or verified.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from tfship.core.manifest import MANIFEST_FILE, ManifestError, VersionManifest

SIGNATURE_FILE = "model.sig"
MIRROR_DIGEST_FILE = ".tfship-manifest-sha256"  # serving.storage.mirror's record of which publish it cached
UNSIGNED_FILES = (SIGNATURE_FILE, MIRROR_DIGEST_FILE)
EXTRA = "model-signing is not installed: install tfship's `signing` extra (pip install -c requirements.lock " \
        "'tfship[signing]')"


class SignatureError(Exception):
    """A version is unsigned, tampered with, substituted or signed by another key; the message is one line."""


@dataclass(frozen=True)
class Verification:
    """What a verified version is: its manifest's sha256, the signer's key id and how many files were signed."""

    manifest_sha256: str
    key_id: str
    signed_files: int

    def to_json(self) -> dict[str, str | int]:
        return {"manifest_sha256": self.manifest_sha256, "key_id": self.key_id, "signed_files": self.signed_files}


def _library():
    try:
        import model_signing.hashing
        import model_signing.signing
        import model_signing.verifying
    except ImportError as err:
        raise SignatureError(EXTRA) from err
    return model_signing


def _hashing(library):
    return library.hashing.Config().set_ignored_paths(paths=list(UNSIGNED_FILES), ignore_git_paths=False) \
        .use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)


def key_id(public_key: Path) -> str:
    """`sha256:<hex>` of the public key's DER SubjectPublicKeyInfo (`openssl pkey -pubin -outform DER | sha256sum`).

    Raises:
        SignatureError: the file is unreadable or not a PEM EC public key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        key = serialization.load_pem_public_key(Path(public_key).read_bytes())
    except (OSError, ValueError) as err:
        raise SignatureError(f"verify key {public_key}: {str(err) or type(err).__name__}") from err
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise SignatureError(f"verify key {public_key}: not an EC public key ({type(key).__name__})")
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def check_verify_key(public_key: Path) -> str:
    """The key id of a usable `--verify-key`, checked at start-up (the library installed, the key parses).

    Raises:
        SignatureError: the `signing` extra is missing or the key is not a PEM EC public key.
    """
    _library()
    return key_id(public_key)


def sign_version(version_dir: Path, private_key: Path) -> Path:
    """Sign every file of `version_dir` (but `UNSIGNED_FILES`) with the PEM EC private key; returns `model.sig`.

    Raises:
        SignatureError: the `signing` extra is missing, the key is unusable, or the folder holds a link.
    """
    library, version_dir = _library(), Path(version_dir)
    (version_dir / SIGNATURE_FILE).unlink(missing_ok=True)
    _refuse_links(version_dir, hardlinks=False)  # a bucket publish signs a folder of hard links to the candidate
    try:
        library.signing.Config().use_elliptic_key_signer(private_key=Path(private_key)) \
            .set_hashing_config(_hashing(library)).sign(version_dir, version_dir / SIGNATURE_FILE)
    except (OSError, ValueError, TypeError) as err:
        raise SignatureError(f"signing {version_dir} with {private_key} failed: {_line(err)}") from err
    return version_dir / SIGNATURE_FILE


def verify_version(version_dir: Path, public_key: Path, model_name: str, version: int) -> Verification:
    """Check that `version_dir`, served as `model_name` version `version`, is what the key's owner signed.

    Raises:
        SignatureError: one line naming what was found: unsigned, a link, a changed / added / removed file, a
            signature by another key, a signed manifest naming another model or version.
    """
    library, version_dir = _library(), Path(version_dir)
    where = f"{version_dir}: signature check failed"
    if not (version_dir / SIGNATURE_FILE).is_file() or (version_dir / SIGNATURE_FILE).is_symlink():
        raise SignatureError(f"{where}: unsigned version (no {SIGNATURE_FILE})")
    signed_by = key_id(public_key)
    try:
        _refuse_links(version_dir)
    except SignatureError as err:
        raise SignatureError(f"{where}: {err}") from None
    config = library.verifying.Config().use_elliptic_key_verifier(public_key=Path(public_key)) \
        .set_hashing_config(_hashing(library))
    try:
        config.verify(version_dir, version_dir / SIGNATURE_FILE)
    except ValueError as err:
        raise SignatureError(f"{where}: {_mismatch(str(err), signed_by)}") from err
    except Exception as err:  # a damaged bundle: the library's parsers raise their own types
        raise SignatureError(f"{where}: {SIGNATURE_FILE} is not a usable signature for the key {signed_by} "
                             f"({_line(err)})") from err
    try:
        raw = (version_dir / MANIFEST_FILE).read_bytes()
        manifest = VersionManifest.from_json(raw, version_dir / MANIFEST_FILE)
    except (OSError, ManifestError) as err:
        raise SignatureError(f"{where}: the signed files hold no usable {MANIFEST_FILE} to name the model "
                             f"and version ({_line(err)})") from err
    if (manifest.model_name, manifest.version) != (model_name, version):
        raise SignatureError(f"{where}: substituted version: signed as model {manifest.model_name!r} version "
                             f"{manifest.version}, served as model {model_name!r} version {version}")
    count = sum(1 for path in version_dir.rglob("*") if path.is_file()) - \
        sum(1 for name in UNSIGNED_FILES if (version_dir / name).is_file())
    return Verification(hashlib.sha256(raw).hexdigest(), signed_by, count)


def _refuse_links(folder: Path, hardlinks: bool = True) -> None:
    """Raises SignatureError naming the first symlink, special file or (`hardlinks`) hard-linked file below
    `folder`.
    """
    for root, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            path = Path(root) / name
            info = path.lstat()
            relative = path.relative_to(folder).as_posix()
            if stat.S_ISLNK(info.st_mode):
                raise SignatureError(f"a symlink: {relative!r} -> {os.readlink(path)!r}")
            if stat.S_ISDIR(info.st_mode):
                continue
            if not stat.S_ISREG(info.st_mode):
                raise SignatureError(f"not a regular file: {relative!r}")
            if hardlinks and info.st_nlink > 1:
                raise SignatureError(f"a hardlink: {relative!r} has {info.st_nlink} names")


def _mismatch(message: str, signed_by: str) -> str:
    """The library's `Signature mismatch: [...]` as tfship's one line: changed, added and removed files."""
    found = []
    for pattern, what in ((r"Extra files found in model '[^']*': ([^\"'\]]+)", "added"),
                          (r"Missing files in model '[^']*': ([^\"'\]]+)", "removed"),
                          (r"Hash mismatch for \\?'([^'\\]+)\\?'", "changed")):
        names = [n.strip() for match in re.findall(pattern, message) for n in match.split(",")]
        if names:
            found.append(f"{what} {', '.join(repr(n) for n in names[:5])}"
                         + (f" and {len(names) - 5} more" if len(names) > 5 else ""))
    if found:
        return "tampered version: " + "; ".join(found)
    return f"{SIGNATURE_FILE} was not made with the key {signed_by} ({message.splitlines()[0][:300]})"


def _line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0][:300] if text else type(err).__name__)

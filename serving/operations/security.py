"""Transport security shared by every listening port: TLS/mTLS material and the bearer-token access policy.

One policy covers the gRPC port, the REST port and the metrics port alike (see README "Security"):

* TLS: `--tls-cert` + `--tls-key` make gRPC, REST (HTTPS) and metrics (HTTPS) encrypted; `--tls-client-ca`
  additionally requires a client certificate signed by that CA on every port (mutual TLS).
* Tokens: `--auth-token-file` / `--auth-token-env` hold the *inference* tokens (Predict, metadata, status,
  metrics). `--admin-token-file` / `--admin-token-env` hold the *admin* tokens, the only ones accepted by
  admin calls (`HandleReloadConfigRequest`); an admin token is also accepted wherever an inference token is.
  Admin calls are refused (PERMISSION_DENIED) unless admin tokens are set, or `--enable-admin-api` turns them
  on for a server that has no tokens at all (a trusted network).

Token file format (both flags): UTF-8 text, one token per line; surrounding whitespace is stripped; blank
lines and lines starting with `#` are ignored; a token may not contain whitespace. A file that holds no
token is refused at start-up, naming the file (it would otherwise turn authentication off).

When the files are read: at start-up, then again whenever one changes (`SecretWatcher`, polled every
`SECRETS_POLL_S` seconds: a new inode, size, mtime or symlink target, so an edit in place and an atomic
replace, such as a Kubernetes Secret update swapping its `..data` link, are both seen). The token files and
the TLS certificate and key are re-read together; a change takes effect for every later call (tokens) or
handshake (TLS). New content that is invalid or empty is refused: the running set stays, an error names the
file. A token file or key that other users can read is reported at start-up (a warning; it still starts).
Environment-variable tokens are read once, at start-up.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfship.core.errors import ConfigError, PermissionDeniedError, UnauthenticatedError

BEARER = "Bearer "
SECRETS_POLL_S = 2.0  # how often the token files and the TLS files are checked for a change
log = logging.getLogger(__name__)


def read_token_file(path: Path, flag: str) -> frozenset[str]:
    """Tokens in `path` (format in the module docstring).

    Raises:
        ConfigError: unreadable file, a token containing whitespace, or no token at all (naming `flag` and the
            file, and the line for a bad token).
    """
    try:
        text = path.read_text(encoding="utf-8-sig")  # a leading byte-order mark is not part of the first token
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read {flag} {path}: {err}") from err
    tokens = set()
    for number, line in enumerate(text.splitlines(), start=1):
        token = line.strip()
        if not token or token.startswith("#"):
            continue
        if any(c.isspace() for c in token):
            raise ConfigError(f"{flag} {path} line {number}: a token may not contain whitespace "
                              "(one token per line; '#' starts a comment line)")
        if not (token.isascii() and token.isprintable()):
            raise ConfigError(f"{flag} {path} line {number}: a token must be printable ASCII (gRPC metadata "
                              "and HTTP headers carry nothing else)")
        tokens.add(token)
    if not tokens:
        raise ConfigError(f"{flag} {path} holds no token (empty, blank or comment lines only); refusing to start "
                          "with authentication off: remove the flag to run without tokens")
    return frozenset(tokens)


def read_token_env(name: str, flag: str) -> frozenset[str]:
    """Comma-separated tokens from environment variable `name`; `ConfigError` if it holds none."""
    tokens = frozenset(t.strip() for t in os.environ.get(name, "").split(",") if t.strip())
    if not tokens:
        raise ConfigError(f"{flag} {name} is empty or unset")
    for number, token in enumerate(sorted(tokens), start=1):
        if not (token.isascii() and token.isprintable()) or any(c.isspace() for c in token):
            raise ConfigError(f"{flag} {name}: token {number} (sorted) is not printable ASCII without whitespace "
                              "(gRPC metadata and HTTP headers carry nothing else)")
    return tokens


@dataclass(frozen=True)
class AccessPolicy:
    """Who may call what, for every transport.

    Attributes:
        inference_tokens: accepted for inference calls (empty and no admin tokens: inference is open).
        admin_tokens: the only tokens accepted for admin calls (also accepted for inference).
        admin_enabled: admin calls allowed at all.
    """

    inference_tokens: frozenset[str] = frozenset()
    admin_tokens: frozenset[str] = frozenset()
    admin_enabled: bool = False

    @property
    def requires_token(self) -> bool:
        """Inference calls need a bearer token."""
        return bool(self.inference_tokens or self.admin_tokens)

    def check(self, authorization: str, admin: bool = False) -> None:
        """Allow or refuse one call from its `Authorization` header value (`Bearer <token>` or '').

        Raises:
            UnauthenticatedError: a token is required and none (or an unknown one) was sent.
            PermissionDeniedError: an admin call while admin calls are off, or with a non-admin token.
        """
        scheme, _, credentials = authorization.strip().partition(" ")
        token = credentials.strip() if scheme.lower() == BEARER.strip().lower() else None  # RFC 7235: any case
        if admin and not self.admin_enabled:
            raise PermissionDeniedError("admin calls (HandleReloadConfigRequest) are off on this server; start it "
                                        "with --admin-token-file/--admin-token-env (or --enable-admin-api when "
                                        "no tokens are used)")
        if not self.requires_token:
            return
        if token is not None and _member(token, self.admin_tokens):
            return
        if token is None or not _member(token, self.inference_tokens):
            raise UnauthenticatedError("missing or invalid bearer token (header 'Authorization: Bearer <token>')")
        if admin:
            raise PermissionDeniedError("this call needs an admin token (--admin-token-file); inference tokens "
                                        "may not reload or unload models")


def _member(token: str, tokens: frozenset[str]) -> bool:
    """Constant-time membership (no early exit on the first differing byte); a token that is not ASCII (a header
    carrying other bytes) matches nothing, since every configured token is printable ASCII.
    """
    if not token.isascii():
        return False
    found = False
    for known in tokens:
        found |= hmac.compare_digest(token.encode(), known.encode())
    return found


def access_policy(settings: Any) -> AccessPolicy:  # a ServerSettings: serving.settings sits above this floor
    """The `AccessPolicy` of `ServerSettings`; raises `ConfigError` for empty token sources or unsafe mixes."""
    inference: frozenset[str] = frozenset()
    if settings.auth_token_file:
        inference |= read_token_file(settings.auth_token_file, "--auth-token-file")
    if settings.auth_token_env:
        inference |= read_token_env(settings.auth_token_env, "--auth-token-env")
    admin: frozenset[str] = frozenset()
    if settings.admin_token_file:
        admin |= read_token_file(settings.admin_token_file, "--admin-token-file")
    if settings.admin_token_env:
        admin |= read_token_env(settings.admin_token_env, "--admin-token-env")
    if settings.enable_admin_api and inference and not admin:
        raise ConfigError("--enable-admin-api with inference tokens but no --admin-token-file/--admin-token-env "
                          "would let any inference token unload every model; give admin tokens instead")
    if admin & inference:
        raise ConfigError("a token appears both in the inference and the admin token sources; admin tokens must "
                          "differ from inference tokens")
    return AccessPolicy(inference, admin, admin_enabled=bool(admin) or settings.enable_admin_api)


def _pem(path: Path, flag: str, kind: bytes) -> bytes:
    """The bytes of a PEM file holding a `kind` block; `ConfigError` naming `flag` and the file otherwise."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"cannot read {flag} {path}: {err}") from err
    if b"-----BEGIN " not in data or kind + b"-----" not in data:
        raise ConfigError(f"{flag} {path} is not a PEM file holding a {kind.decode()} block")
    return data


@dataclass(frozen=True)
class TlsMaterial:
    """PEM bytes of the server certificate chain, its key and the client CA (None: no mutual TLS)."""

    cert_path: Path
    key_path: Path
    cert: bytes
    key: bytes
    client_ca_path: Path | None = None
    client_ca: bytes | None = None


def tls_material(settings) -> TlsMaterial | None:
    """TLS files of `ServerSettings` (None without `--tls-cert`); `ConfigError` naming a missing or bad file."""
    if not settings.tls_cert:
        if settings.tls_key or settings.tls_client_ca:
            raise ConfigError("--tls-key/--tls-client-ca need --tls-cert")
        return None
    if not settings.tls_key:
        raise ConfigError("--tls-cert needs --tls-key")
    ca_path = settings.tls_client_ca
    return TlsMaterial(settings.tls_cert, settings.tls_key, _pem(settings.tls_cert, "--tls-cert", b"CERTIFICATE"),
                       _pem(settings.tls_key, "--tls-key", b"PRIVATE KEY"), ca_path,
                       _pem(ca_path, "--tls-client-ca", b"CERTIFICATE") if ca_path else None)


def grpc_credentials(material: TlsMaterial | None):
    """`grpc.ServerCredentials` for `material` (client certificate required when a client CA is set)."""
    if material is None:
        return None
    import grpc

    return grpc.ssl_server_credentials([(material.key, material.cert)], root_certificates=material.client_ca,
                                       require_client_auth=material.client_ca is not None)


def ssl_context(material: TlsMaterial | None) -> ssl.SSLContext | None:
    """Server `ssl.SSLContext` for the HTTP ports (REST, metrics): TLS 1.2+, client certificate required when a
    client CA is set. Raises `ConfigError` when the key does not match the certificate, or the client CA file's
    certificates do not load.
    """
    if material is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(material.cert_path, material.key_path)
    except (ssl.SSLError, OSError) as err:
        raise ConfigError(f"--tls-cert {material.cert_path} / --tls-key {material.key_path} do not form a usable "
                          f"certificate and key: {err}") from err
    if material.client_ca is not None:
        try:
            context.load_verify_locations(cadata=material.client_ca.decode("ascii", errors="replace"))
        except (ssl.SSLError, ValueError) as err:  # a PEM block whose body is not a certificate
            raise ConfigError(f"--tls-client-ca {material.client_ca_path} holds no usable CA certificate: "
                              f"{err}") from err
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class LivePolicy:
    """The `AccessPolicy` in force, replaced when the token files change (`SecretWatcher`); transports hold this
    object and call `check` / `requires_token` as on an `AccessPolicy` (one attribute read: safe from any thread).
    """

    def __init__(self, policy: AccessPolicy) -> None:
        self.current = policy

    @property
    def requires_token(self) -> bool:
        """As `AccessPolicy.requires_token`, for the policy in force."""
        return self.current.requires_token

    def check(self, authorization: str, admin: bool = False) -> None:
        """As `AccessPolicy.check`, for the policy in force."""
        self.current.check(authorization, admin)


Policy = AccessPolicy | LivePolicy  # what the transports check calls against (`check`, `requires_token`)


class LiveTls:
    """TLS material in force on every port, replaced without a restart.

    gRPC gets dynamic credentials (`grpc.dynamic_ssl_server_credentials`: each new handshake asks for the latest
    certificate and client CAs). The HTTP ports stay bound to the `ssl.SSLContext` they started with, whose
    `sni_callback` hands each new handshake the context built from the latest material (Python's `ssl`: the
    callback may set `SSLObject.context`; it runs for clients that send no server name too). So a new
    certificate, key or client CA set replaces the old one for every new connection, on all three ports, and a
    client CA that was removed is no longer trusted; connections already open keep theirs.
    """

    def __init__(self, material: TlsMaterial, context: ssl.SSLContext | None) -> None:
        self.material = material
        self._context = context  # the one the HTTP sites were bound with
        self._serving = context  # the one new HTTPS handshakes get
        if context is not None:
            context.sni_callback = self._select
        self._pending = None  # a new gRPC certificate configuration, handed out at the next handshake

    def grpc_credentials(self):
        """`grpc.ServerCredentials` that follow `apply` (client certificate required when a client CA is set)."""
        import grpc

        return grpc.dynamic_ssl_server_credentials(self._grpc_config(self.material), self._fetch,  # pyright: ignore[reportArgumentType]  # typeshed's grpc stub: a fetcher may answer None ("no change"), as _fetch does
                                                   require_client_authentication=self.material.client_ca is not None)

    @staticmethod
    def _grpc_config(material: TlsMaterial):
        import grpc

        return grpc.ssl_server_certificate_configuration([(material.key, material.cert)],
                                                         root_certificates=material.client_ca)

    def _fetch(self):
        pending, self._pending = self._pending, None
        return pending

    def _select(self, ssl_object: ssl.SSLObject, _server_name: str | None, bound: ssl.SSLContext) -> None:
        """`sni_callback` of the bound context: switch the handshake to the latest context."""
        serving = self._serving
        assert serving is not None  # installed on a bound context only
        if serving is not bound:
            ssl_object.context = serving

    def apply(self, material: TlsMaterial) -> None:
        """Serve `material` from the next handshake on; `ConfigError` (nothing changed) when the key does not match
        the certificate.
        """
        fresh = ssl_context(material)  # validates the pair before anything is swapped
        if self._context is not None:
            self._serving = fresh
        self._pending = self._grpc_config(material)
        self.material = material


def _fingerprint(path: Path | None):
    """What changes when `path` is edited or replaced (atomically, or by a symlink swap); None when missing."""
    if path is None:
        return None
    try:
        info = os.stat(path)
    except OSError:
        return None
    return os.path.realpath(path), info.st_ino, info.st_dev, info.st_mtime_ns, info.st_size


def warn_readable_secrets(settings) -> list[Path]:
    """Log a warning for each token file or TLS key other users may read; returns those paths."""
    readable = []
    for flag, path in (("--auth-token-file", settings.auth_token_file),
                       ("--admin-token-file", settings.admin_token_file), ("--tls-key", settings.tls_key)):
        try:
            if path is not None and os.stat(path).st_mode & stat.S_IROTH:
                readable.append(path)
                log.warning("%s %s is readable by every user on this host; restrict it (chmod o-r, or "
                            "defaultMode 0440 for a Kubernetes Secret)", flag, path)
        except OSError:
            continue
    return readable


class SecretWatcher:
    """Re-reads the token files and the TLS files when one of them changes (module docstring: when).

    Args:
        settings: `ServerSettings` (the file paths and the environment-variable tokens, re-read with them).
        policy: the `LivePolicy` the transports hold.
        tls: the `LiveTls` of the ports, or None without TLS.
    """

    def __init__(self, settings, policy: LivePolicy, tls: LiveTls | None = None) -> None:
        self._settings = settings
        self._policy = policy
        self._tls = tls
        self._token_paths = [p for p in (settings.auth_token_file, settings.admin_token_file) if p]
        self._tls_paths = [p for p in (settings.tls_cert, settings.tls_key, settings.tls_client_ca) if p] if tls else []
        self._seen = self._fingerprints()

    @property
    def watching(self) -> bool:
        """Some file is there to watch."""
        return bool(self._token_paths or self._tls_paths)

    def _fingerprints(self) -> dict:
        return {path: _fingerprint(path) for path in self._token_paths + self._tls_paths}

    def check_once(self) -> bool:
        """Re-read what changed since the last look; True when a new set was taken into use."""
        now = self._fingerprints()
        changed = {path for path in now if now[path] != self._seen.get(path)}
        self._seen = now  # a bad file is reported once per change, not on every poll
        took = False
        if changed & set(self._token_paths):
            try:
                self._policy.current = access_policy(self._settings)
                took = True
                log.info("re-read the token files %s; the new tokens are in force", [str(p) for p in self._token_paths])
            except ConfigError as err:
                log.error("token files changed but were not taken into use; the running tokens stay: %s", err)
        if changed & set(self._tls_paths):
            try:
                material = tls_material(self._settings)
                assert self._tls is not None and material is not None  # watched only when TLS is on (--tls-cert)
                self._tls.apply(material)
                took = True
                log.info("re-read the TLS files %s; new connections use them", [str(p) for p in self._tls_paths])
            except ConfigError as err:
                log.error("TLS files changed but were not taken into use; the running certificate stays: %s", err)
        return took

    async def watch_forever(self, interval_s: float = SECRETS_POLL_S) -> None:
        """`check_once` every `interval_s` seconds until cancelled (file reads run off the event loop). A check
        that fails in a way `check_once` does not foresee is logged with its traceback and the watch goes on:
        one bad file never ends rotation for the files after it.
        """
        while True:
            await asyncio.sleep(interval_s)
            try:
                await asyncio.to_thread(self.check_once)
            except Exception:
                log.exception("checking the token and TLS files failed; the running tokens and certificate stay; "
                              "checking again in %.0fs", interval_s)

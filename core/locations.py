"""Where a path points: a local folder or file, or an object-store URL (`s3://bucket/prefix`).

Every path tfship takes from a user goes through here, so a URL is never mistaken for a folder name:
`Path("s3://bucket/models")` is the relative folder `s3:/bucket/models`, and writing there silently leaves the
bucket empty. `s3://` is read and written through fsspec + s3fs (the `bucket` extra); every other scheme
(`gs://`, `http://`, `hdfs://`, `file://`, ...) is refused by name, with the field that held it.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from tfship.core.errors import ConfigError

BUCKET_SCHEMES = ("s3",)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class BucketUrl(str):
    """An object-store location, `s3://bucket/key/prefix`, kept as its text (so it serialises as itself).

    Attributes (read-only): `scheme` (`s3`), `bucket`, `key` (no leading or trailing `/`; '' for the bucket).
    `url / "part"` joins a key part.
    """

    __slots__ = ()

    def __new__(cls, text: str) -> BucketUrl:
        match = _SCHEME.match(text)
        if not match or match.group(1).lower() not in BUCKET_SCHEMES:
            raise ValueError(f"not an object-store URL: {text!r}")
        rest = text[match.end():].strip("/")
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise ValueError(f"{text!r} names no bucket (expected s3://BUCKET/PREFIX)")
        return super().__new__(cls, f"{match.group(1).lower()}://{bucket}" + (f"/{key.strip('/')}" if key else ""))

    @property
    def scheme(self) -> str:
        return self.split("://", 1)[0]

    @property
    def bucket(self) -> str:
        return self.split("://", 1)[1].split("/", 1)[0]

    @property
    def key(self) -> str:
        parts = self.split("://", 1)[1].split("/", 1)
        return parts[1] if len(parts) > 1 else ""

    @property
    def name(self) -> str:
        """The last key part ('' for a bare bucket), like `Path.name`."""
        return self.key.rsplit("/", 1)[-1] if self.key else ""

    def __truediv__(self, part: str) -> BucketUrl:
        return BucketUrl(f"{self.rstrip('/')}/{str(part).strip('/')}")


Location = Path | BucketUrl


def url_scheme(text: str) -> str | None:
    """The URL scheme of `text` (`s3`, `gs`, ...), or None for a plain path."""
    match = _SCHEME.match(text)
    return match.group(1).lower() if match else None


def _refusal(field: str, text: str, scheme: str, allowed: tuple[str, ...]) -> str:
    shown = text if len(text) <= 200 else text[:200] + f"… ({len(text)} chars)"
    if allowed:
        return (f"{field}: {shown!r} uses the URL scheme {scheme}://, which tfship does not read; use a local "
                f"path or {' or '.join(s + '://BUCKET/PREFIX' for s in allowed)}")
    return f"{field}: {shown!r} is a {scheme}:// URL; a local path is expected here"


def parse_location(value: Any, field: str, *, buckets: bool = True) -> Location:
    """A local `Path`, or a `BucketUrl` when `buckets` and `value` is an `s3://` URL.

    Args:
        value: text or a path-like.
        field: what held it, named in the error (`--repository`, `publish.repository`, `base_path` ...).
        buckets: whether object-store URLs are accepted here (repositories and model base paths); config
            files and data sets take local paths only.

    Raises:
        ConfigError: a URL with a scheme this field does not take (named with the field and the value), or an
            `s3://` URL without a bucket.
    """
    if isinstance(value, BucketUrl):
        if not buckets:
            raise ConfigError(_refusal(field, str(value), value.scheme, ()))
        return value
    if isinstance(value, Path):
        return value
    text = str(value)
    scheme = url_scheme(text)
    if scheme is None:
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/[^/]", text) and text.split(":", 1)[0].lower() in BUCKET_SCHEMES:
            raise ConfigError(f"{field}: {text!r} looks like a URL with one slash; write {text.split(':', 1)[0]}://")
        return Path(text)
    allowed = BUCKET_SCHEMES if buckets else ()
    if scheme not in allowed:
        raise ConfigError(_refusal(field, text, scheme, allowed))
    try:
        return BucketUrl(text)
    except ValueError as err:
        raise ConfigError(f"{field}: {err}") from err


def _cli(value: str, buckets: bool) -> Location:
    try:
        return parse_location(value, "flag", buckets=buckets)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("flag: ")) from err


def cli_path(value: str) -> Path:
    """Argparse `type=` for flags that take a local path: any URL is refused (argparse: exit 2 naming the flag)."""
    location = _cli(value, buckets=False)
    assert isinstance(location, Path), location  # buckets=False: parse_location refuses every URL
    return location


def cli_location(value: str) -> Location:
    """Argparse `type=` for repositories and model base paths: a local path or an `s3://` URL."""
    return _cli(value, buckets=True)


def pydantic_validator(field: str, *, buckets: bool):
    """A pydantic `BeforeValidator` function with `parse_location`'s rule (raises ValueError for pydantic)."""

    def convert(value: Any) -> Any:
        if value is None:
            return None
        try:
            return parse_location(value, field, buckets=buckets)
        except ConfigError as err:
            raise ValueError(str(err).removeprefix(f"{field}: ")) from err

    return convert

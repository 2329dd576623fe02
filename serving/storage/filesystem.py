"""Object-store access through fsspec (s3fs for `s3://`), with credentials and endpoints from the standard places.

Credentials come from botocore's own chain: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN`,
`AWS_PROFILE` with `~/.aws/credentials` and `~/.aws/config`, then instance or pod roles. The endpoint of an
S3-compatible store (MinIO, Ceph, a test server) comes from `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL`.
Directory listings are never cached: a poll must see a version the moment its marker is written.
"""

from __future__ import annotations

import os
from pathlib import Path

from tfship.core.errors import ConfigError
from tfship.core.locations import BucketUrl, Location

EXTRA_HINT = "pip install 'tfship[bucket]' (fsspec + s3fs; no TensorFlow)"


def open_filesystem(url: BucketUrl):
    """An fsspec filesystem for `url`'s scheme (`s3fs.S3FileSystem` for s3://).

    Raises:
        ConfigError: the bucket extra is not installed (the message says what to install).
    """
    try:
        import s3fs
    except ImportError as err:
        raise ConfigError(f"{url}: reading or writing s3:// needs the bucket extra: {EXTRA_HINT}") from err
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True,
                             client_kwargs={"endpoint_url": endpoint} if endpoint else {})


def read_text(location: Location) -> str:
    """The UTF-8 text of a local file or of an s3:// object.

    Raises:
        OSError: missing or unreadable (FileNotFoundError for a missing object, as for a file).
        UnicodeDecodeError: not UTF-8.
        ConfigError: an s3:// location without the bucket extra installed.
    """
    if isinstance(location, BucketUrl):
        return open_filesystem(location).cat_file(key_path(location)).decode("utf-8")
    return Path(location).read_text(encoding="utf-8")


def write_text(location: Location, text: str) -> None:
    """Replace a local file (temporary file + rename) or an s3:// object (one PUT) with `text`, atomically."""
    if isinstance(location, BucketUrl):
        open_filesystem(location).pipe_file(key_path(location), text.encode("utf-8"))
        return
    path = Path(location)
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staged.write_text(text, encoding="utf-8")
    os.replace(staged, path)


def key_path(url: BucketUrl) -> str:
    """`bucket/key` as fsspec names it (no scheme)."""
    return f"{url.bucket}/{url.key}".rstrip("/")

"""Object-store access through fsspec (s3fs for `s3://`), with credentials and endpoints from the standard places.

Credentials come from botocore's own chain: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN`,
`AWS_PROFILE` with `~/.aws/credentials` and `~/.aws/config`, then instance or pod roles. The endpoint of an
S3-compatible store (MinIO, Ceph, a test server) comes from `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL`.
Directory listings are never cached: a poll must see a version the moment its marker is written.
"""

from __future__ import annotations

import os

from tfship.core.errors import ConfigError
from tfship.core.locations import BucketUrl

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


def key_path(url: BucketUrl) -> str:
    """`bucket/key` as fsspec names it (no scheme)."""
    return f"{url.bucket}/{url.key}".rstrip("/")

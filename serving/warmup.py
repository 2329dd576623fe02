"""Read TF Serving warmup files (`assets.extra/tf_serving_warmup_requests`) without TensorFlow.

The file is a TFRecord of `tensorflow.serving.PredictionLog`; each record is
`uint64 length | uint32 masked crc32c(length) | data | uint32 masked crc32c(data)` (little-endian).
CRCs are not checked; truncation is an error.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from core.errors import TfshipError
from core import protocol
from serving.tensors import from_tensor_proto

WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"


def read_records(path: Path) -> Iterator[bytes]:
    """Yield the raw records of a TFRecord file; raises `TfshipError` on a truncated record."""
    data = Path(path).read_bytes()
    offset = 0
    while offset < len(data):
        if offset + 12 > len(data):
            raise TfshipError(f"{path}: truncated TFRecord header at byte {offset}")
        (length,) = struct.unpack_from("<Q", data, offset)
        start, end = offset + 12, offset + 12 + length
        if end + 4 > len(data):
            raise TfshipError(f"{path}: truncated TFRecord payload at byte {offset}")
        yield data[start:end]
        offset = end + 4


def warmup_predicts(version_dir: Path) -> list[tuple[str, dict[str, np.ndarray]]]:
    """(signature_name, inputs) of every PredictLog in the version's warmup file ([] when absent).

    Classify/Regress/MultiInference logs are skipped (tfship serves Predict only).
    """
    path = Path(version_dir) / WARMUP_FILE
    if not path.is_file():
        return []
    out = []
    for record in read_records(path):
        log = protocol.PredictionLog.FromString(record)
        if log.WhichOneof("log_type") != "predict_log":
            continue
        request = log.predict_log.request
        inputs = {k: from_tensor_proto(v, k) for k, v in request.inputs.items()}
        out.append((request.model_spec.signature_name or "serving_default", inputs))
    return out

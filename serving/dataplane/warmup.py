"""Read and write TF Serving warmup files (`assets.extra/tf_serving_warmup_requests`) without TensorFlow.

The file is a TFRecord of `tensorflow.serving.PredictionLog`; each record is
`uint64 length | uint32 masked crc32c(length) | data | uint32 masked crc32c(data)` (little-endian).
As TF Serving does, a file is refused (and the version does not load) when a record is damaged (either
checksum differs, or the file ends inside a record), does not parse as a PredictionLog, or when it holds
more than 1,000 records; each message names the file and the record number (1-based).
`write_warmup_requests` writes the same format (what `tf.io.TFRecordWriter` writes; the publish stage uses it).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import google_crc32c
import numpy as np
from google.protobuf.message import DecodeError

from tfship.core import protocol
from tfship.core.errors import ConfigError
from tfship.serving.dataplane.tensors import from_tensor_proto, to_tensor_proto

WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"


MAX_RECORDS = 1000  # TF Serving's WarmupConsts::kMaxNumRecords
_MASK_DELTA = 0xA282EAD8


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C of `data` (rotate right 15, add 0xa282ead8, modulo 2^32)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def encode_record(data: bytes) -> bytes:
    """One TFRecord frame holding `data` (what `tf.io.TFRecordWriter` writes)."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc(header)) + data + struct.pack("<I", masked_crc(data))


class WarmupFileError(ConfigError):
    """A warm-up file is damaged, unreadable or too long (names the file and the record number)."""


def read_records(path: Path, max_records: int = MAX_RECORDS) -> Iterator[bytes]:
    """Yield the records of a TFRecord file, checking both checksums of each.

    Raises:
        WarmupFileError: a truncated record, a checksum mismatch, or more than `max_records` records.
    """
    data = Path(path).read_bytes()
    offset, number = 0, 0
    while offset < len(data):
        number += 1
        if number > max_records:
            raise WarmupFileError(f"Number of warmup records exceeds the maximum ({max_records}) at {path}: "
                                  f"record {number} starts at byte {offset}")
        if offset + 12 > len(data):
            raise WarmupFileError(f"{path}: record {number} is damaged: the file ends inside its header "
                                  f"(byte {offset})")
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        if struct.unpack_from("<I", data, offset + 8)[0] != masked_crc(header):
            raise WarmupFileError(f"{path}: record {number} is damaged: the length checksum (masked CRC32C) "
                                  f"does not match (byte {offset}); verify the warmup data is in TFRecord format")
        start, end = offset + 12, offset + 12 + length
        if end + 4 > len(data):
            raise WarmupFileError(f"{path}: record {number} is damaged: its {length} bytes run past the end of "
                                  f"the file (byte {offset})")
        payload = data[start:end]
        if struct.unpack_from("<I", data, end)[0] != masked_crc(payload):
            raise WarmupFileError(f"{path}: record {number} is damaged: the data checksum (masked CRC32C) does "
                                  f"not match (byte {offset})")
        yield payload
        offset = end + 4


def warmup_predicts(version_dir: Path) -> list[tuple[str, dict[str, np.ndarray]]]:
    """(signature_name, inputs) of every PredictLog in the version's warmup file ([] when absent).

    Classify/Regress/MultiInference logs are skipped (tfship serves Predict only).

    Raises:
        WarmupFileError: see `read_records`; a record that is not a PredictionLog.
    """
    path = Path(version_dir) / WARMUP_FILE
    if not path.is_file():
        return []
    out = []
    for number, record in enumerate(read_records(path), start=1):
        try:
            log = protocol.PredictionLog.FromString(record)
        except DecodeError as err:
            raise WarmupFileError(f"Failed to parse warmup record: {number} from {path} as a "
                                  f"tensorflow.serving.PredictionLog: {err}") from err
        if log.WhichOneof("log_type") != "predict_log":
            continue
        request = log.predict_log.request
        inputs = {k: from_tensor_proto(v, k) for k, v in request.inputs.items()}
        out.append((request.model_spec.signature_name or "serving_default", inputs))
    return out


def write_warmup_requests(version_dir: Path, model_name: str, signature: str, inputs: dict[str, np.ndarray],
                          batch_sizes: tuple[int, ...] = (1, 8)) -> Path:
    """Write the version's warm-up file: one `PredictionLog` (a `PredictRequest` of the first `batch_size`
    rows of every input) per batch size, so TF Serving and tfship replay them before routing traffic.

    Args:
        inputs: {input alias: [N, ...] array}; N at least the largest batch size gives full batches.

    Returns:
        The file written, `<version_dir>/assets.extra/tf_serving_warmup_requests`.
    """
    path = Path(version_dir) / WARMUP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = []
    for batch_size in batch_sizes:
        log = protocol.PredictionLog()
        request = log.predict_log.request
        request.model_spec.name = model_name
        request.model_spec.signature_name = signature
        for name, value in inputs.items():
            request.inputs[name].CopyFrom(to_tensor_proto(np.asarray(value)[:batch_size]))
        frames.append(encode_record(log.SerializeToString()))
    path.write_bytes(b"".join(frames))
    return path

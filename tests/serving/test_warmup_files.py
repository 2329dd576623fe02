"""Warm-up files are checked as TF Serving checks them: checksums, record count, PredictionLog records.

A damaged or too long `assets.extra/tf_serving_warmup_requests` keeps the version from loading, with a
message naming the file and the record number; the previous version keeps serving.
"""

from __future__ import annotations

import asyncio
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import MODEL

from tfship.core import protocol
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import ModelConfig
from tfship.serving.dataplane.tensors import to_tensor_proto
from tfship.serving.dataplane.types import ModelRef, VersionState
from tfship.serving.dataplane.warmup import MAX_RECORDS, WARMUP_FILE, WarmupFileError, encode_record, warmup_predicts
from tfship.serving.runtimes import RuntimeOptions


def _log(rows: int = 1) -> bytes:
    log = protocol.PredictionLog()
    log.predict_log.request.inputs["image"].CopyFrom(to_tensor_proto(np.zeros((rows, 8, 8, 1), np.float32)))
    return log.SerializeToString()


def test_records_are_framed_as_tensorflow_writes_them(repository):
    written_by_tf = (repository / MODEL / "1" / WARMUP_FILE).read_bytes()
    payload = written_by_tf[12:-4]
    assert encode_record(payload) == written_by_tf  # same length and data checksums as tf.io.TFRecordWriter


@pytest.fixture()
def version(tmp_path, repository):
    target = tmp_path / MODEL / "1"
    shutil.copytree(repository / MODEL / "1", target)
    return target


def _write(version, data: bytes):
    path = version / WARMUP_FILE
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(("damage", "message"), [
    ("data", "record 2 is damaged: the data checksum (masked CRC32C) does not match (byte {second})"),
    ("length", "record 2 is damaged: the length checksum (masked CRC32C) does not match (byte {second}); verify "
               "the warmup data is in TFRecord format"),
    ("truncated", "record 2 is damaged: its {size} bytes run past the end of the file (byte {second})"),
    ("header", "record 3 is damaged: the file ends inside its header (byte {third})"),
])
def test_damaged_record_is_refused_naming_file_and_record(version, damage, message):
    first, second = encode_record(_log(1)), bytearray(encode_record(_log(2)))
    size = len(second) - 16
    if damage == "data":
        second[20] ^= 0x01
    elif damage == "length":
        second[9] ^= 0x80
    elif damage == "truncated":
        second = second[:-3]
    elif damage == "header":
        second += b"\x05\x00\x00"
    path = _write(version, first + bytes(second))
    with pytest.raises(WarmupFileError) as err:
        warmup_predicts(version)
    third = len(first) + len(second) - 3
    assert str(err.value) == f"{path}: " + message.format(second=len(first), size=size, third=third)


def test_more_than_1000_records_is_refused(version):
    record = encode_record(_log(1))
    path = _write(version, record * MAX_RECORDS)
    assert len(warmup_predicts(version)) == 1000  # exactly the maximum is fine
    _write(version, record * (MAX_RECORDS + 1))
    with pytest.raises(WarmupFileError) as err:
        warmup_predicts(version)
    assert str(err.value) == (f"Number of warmup records exceeds the maximum (1000) at {path}: record 1001 starts "
                              f"at byte {len(record) * 1000}")


def test_record_that_is_not_a_prediction_log_is_refused(version):
    path = _write(version, encode_record(_log(1)) + encode_record(b"\xff\xff\xff"))
    with pytest.raises(WarmupFileError, match=f"Failed to parse warmup record: 2 from {path} as a "
                                              "tensorflow.serving.PredictionLog"):
        warmup_predicts(version)


def test_damaged_warmup_file_keeps_the_version_from_loading(version):
    record = bytearray(encode_record(_log(1)))
    record[-1] ^= 0xFF
    path = _write(version, bytes(record))

    async def run():
        with ThreadPoolExecutor(2) as pool:
            manager = ModelManager("tflite", RuntimeOptions(), pool)
            await manager.apply_config([ModelConfig(MODEL, version.parent)])
            return manager.statuses(ModelRef(MODEL))

    [status] = asyncio.run(run())
    assert status.state is VersionState.END and status.error_code == "INVALID_ARGUMENT"
    assert f"{path}: record 1 is damaged: the data checksum" in status.error_message

"""The serve-check's record holds typed rows (`ServeCheckRow`, `SignatureAnswer`), and `serve_check.json` keeps its
shape: a record written before the rows were typed reads back into them.
"""

from __future__ import annotations

import json

import pytest

from tfship.pipeline.gate.serve_check import ServeCheckResult, ServeCheckRow, SignatureAnswer

WRITTEN_BEFORE = {  # a `serve_check.json` as the stage wrote it with dict rows
    "passed": True, "left_out": {"tflite_int8": "serve-check [tflite --tflite-file model_int8.tflite]: logits"},
    "required": ["onnx"],
    "artifacts": {
        "saved_model": {"backend": "saved_model", "flags": [], "passed": True, "reason": "", "requests": 3,
                        "max_abs_error": 0.0, "seconds": 1.5,
                        "signatures": {"score": {"passed": True, "reason": "", "requests": 3}}},
        "onnx": {"backend": "onnx", "flags": [], "passed": True, "reason": "", "requests": 3,
                 "max_abs_error": 1.2e-6, "seconds": 0.8, "signatures": {}},
        "tflite_int8": {"backend": "tflite", "flags": ["--tflite-file", "model_int8.tflite"], "passed": False,
                        "reason": "serve-check [tflite --tflite-file model_int8.tflite]: logits", "requests": 3,
                        "max_abs_error": 0.4, "seconds": 0.3,
                        "signatures": {"score": {"passed": False, "reason": "score: 0.2 > 0.1", "requests": 3}}}},
    "signatures_unchecked": {"onnx": {"score": "its inputs are not in the data"}},
}


def test_a_record_written_with_dict_rows_reads_into_typed_rows_and_back_unchanged():
    result = ServeCheckResult.from_json(json.loads(json.dumps(WRITTEN_BEFORE)))
    int8 = result.artifacts["tflite_int8"]
    assert isinstance(int8, ServeCheckRow) and int8.flags == ("--tflite-file", "model_int8.tflite")
    assert int8.signatures["score"] == SignatureAnswer(False, "score: 0.2 > 0.1", 3)
    assert result.verdict("tflite_int8") == (False, WRITTEN_BEFORE["left_out"]["tflite_int8"])
    assert result.signature_verdict("saved_model", "score") == (True, "")
    assert result.signature_verdict("onnx", "score") is None and result.verdict("tflite_float32") is None
    assert result.passed and result.served == ["saved_model", "onnx"]
    assert result.to_json() == WRITTEN_BEFORE
    assert ServeCheckResult.from_json(result.to_json()) == result


def test_a_failed_required_row_fails_the_record_and_a_row_without_a_verdict_is_refused():
    rows = json.loads(json.dumps(WRITTEN_BEFORE["artifacts"]))
    rows["onnx"]["passed"] = False
    assert not ServeCheckResult(rows, ("onnx",)).passed
    del rows["onnx"]["passed"]
    with pytest.raises(KeyError, match="passed"):
        ServeCheckResult(rows)

"""The serving benchmark's references and report: real reference servers loaded by the real load generator,
and the issue-14 arithmetic (one-core limit, ratios, PASS/MISS) on known figures."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.serve import report
from bench.serve.endpoints import ReferenceEndpoint, rest_bodies
from bench.serve.run_bench import loadgen, parse


@pytest.fixture
def plan(tmp_path: Path):
    return dataclasses.replace(parse(["--work", str(tmp_path), "--out", str(tmp_path), "--quick"]), levels=(1, 4),
                               warmup_s=0.1, window_s=0.4)


def test_bare_grpc_server_answers_the_load_generator_with_its_prebuilt_reply(plan, tmp_path):
    reply = tmp_path / "reply.bin"
    reply.write_bytes(b"\x0a\x03abc")  # any bytes: the bare server never parses either side
    request = tmp_path / "request.bin"
    request.write_bytes(b"\x0a\x01x")
    with ReferenceEndpoint("bare_server", ["--response-file", str(reply)], None) as server:
        from bench.serve.endpoints import grpc_reply

        assert grpc_reply(server.grpc_target, request.read_bytes()) == reply.read_bytes()
        levels = loadgen(plan, server, request)
    assert [lvl["concurrency"] for lvl in levels] == [1, 4]
    assert all(lvl["errors"] == 0 and lvl["requests"] > 0 for lvl in levels)


def test_rest_load_generator_counts_answers_and_http_errors(plan, tmp_path):
    body = tmp_path / "reply.json"
    body.write_text(json.dumps({"predictions": [[0.5, 0.5]]}))
    request = tmp_path / "request.json"
    request.write_bytes(rest_bodies("x", [1.0, 2.0])["row"])
    with ReferenceEndpoint("bare_rest", ["--response-file", str(body)], None) as server:
        good = loadgen(plan, server, request, rest_url=server.rest_url("m"))
        missing = loadgen(plan, server, request, rest_url=server.rest_url("m").replace(":predict", ":nothing"))
    assert all(lvl["errors"] == 0 and lvl["requests"] > 0 for lvl in good)
    assert all(lvl["requests"] == 0 and set(lvl["error_codes"]) == {"HTTP 404"} for lvl in missing)


def _row(mode, model, case, c, rate, p50=1.0, p99=2.0):
    return {"mode": mode, "model": model, "case": case, "concurrency": c, "repeat": 0, "inferences_per_s": rate,
            "latency_ms": {"p50": p50, "p99": p99}, "server_cpu": 1.0, "errors": 0, "mean_batch_rows": None}


def test_targets_use_the_runs_own_limit_and_medians():
    rows = [_row("grpc", "mlp", "bare", 32, r) for r in (3000, 3200, 9000)]  # median 3,200
    rows += [{"mode": "inprocess", "model": "mlp", "batch": 32, "inferences_per_s": 9600}]
    rows += [_row("grpc", "mlp", "onnx_batching", 32, 2300, p50=10, p99=25), _row("grpc", "mlp", "identity", 32, 2900)]
    rows += [_row("grpc", "mlp", "onnx_batching", 1, 700), _row("grpc", "mlp", "onnx", 1, 720)]
    rows += [_row("grpc", "digits", "ort", 8, 2000), _row("grpc", "digits", "onnx_batching", 8, 2100)]
    found, limit = report.targets(rows, (8, 32))
    assert limit["limit"] == pytest.approx(1 / (1 / 3200 + 1 / 9600))  # 2,400
    by_name = {t["target"]: t for t in found}
    heavy = by_name["heavy: tfship onnx batching c=32 / one-core limit"]
    assert heavy["value"] == pytest.approx(2300 / 2400) and heavy["met"]
    assert by_name["identity / bare grpc.aio, heavy payload, c=32"]["value"] == pytest.approx(2900 / 3200)
    assert by_name["small: tfship onnx batching / hand-written ORT, c=8"]["met"]
    assert by_name["heavy: tfship onnx batching c=32 p99 / p50"]["value"] == pytest.approx(2.5)
    no_loss = by_name["heavy c=1: batching / no batching (no loss; 5 % noise allowance)"]
    assert no_loss["value"] == pytest.approx(700 / 720) and no_loss["met"]
    assert by_name["identity / bare grpc.aio, heavy payload, c=8"]["value"] is None  # not measured: MISS, not PASS
    assert not by_name["identity / bare grpc.aio, heavy payload, c=8"]["met"]


def test_thread_figures_are_per_request_medians_and_rendered():
    threads = {"main": {"cpu_s": 0.3, "wait_s": 0.0, "voluntary": 10, "involuntary": 2000},
               "event_engine": {"cpu_s": 0.1, "wait_s": 0.0, "voluntary": 5, "involuntary": 0}}
    rows = [{**_row("grpc", "mlp", "identity", 32, 2000), "requests_per_s": 2000, "window_s": 1.0,
             "server_threads": threads}]
    m = report.medians(rows)[("grpc", "mlp", "identity", 32)]
    assert m["main_us"] == pytest.approx(150) and m["other_us"] == pytest.approx(50)
    assert m["main_preempted"] == pytest.approx(1.0)
    cost = {"warm": {"us_per_call": 14.5, "calls": 15000}, "cold": {"us_per_call": 98.0, "calls": 3000, "evict_mib": 64}}
    text = "\n".join(report._threads(report.medians(rows), cost))
    assert "| mlp | identity | 32 | 2,000 | 150 | 50 | 200 | 1.0 |" in text
    assert "14.5 us CPU per call" in text and "98.0 us** when 64 MiB" in text


def test_answer_encodings_get_a_target_and_a_table():
    rows = [_row("grpc", "mlp", "onnx_batching", 32, 1900), _row("grpc", "mlp", "onnx_batching_tensor_content", 32, 2000)]
    rows += [_row("grpc", "digits", "identity", 32, 3000), _row("grpc", "digits", "identity_tensor_content", 32, 3300)]
    by_name = {t["target"]: t for t in report.targets(rows, (32,))[0]}
    typed = by_name["heavy c=32: typed-field answers (default) / tensor_content answers, onnx batching"]
    assert typed["value"] == pytest.approx(0.95) and typed["met"]
    text = "\n".join(report._encodings(report.medians(rows), (32,)))
    assert "| tfship onnx, batching (10 outputs) | typed fields (float_val, ...) | - | 1,900 (0.95x) |" in text
    assert "| tfship identity (echoes the input: 64 / 784 floats) | tensor_content | 3,300 | - |" in text


def test_targets_carry_their_spread_over_rounds_and_a_fall_is_named():
    def rounds(ident_rates):
        rows = []
        for repeat, rate in enumerate(ident_rates):
            rows += [{**_row("grpc", "mlp", "bare", 32, 4000), "repeat": repeat},
                     {**_row("grpc", "mlp", "identity", 32, rate), "repeat": repeat}]
        return rows

    found, limit = report.targets(rounds((2000, 2400, 2200)), (32,))
    ident = next(t for t in found if t["target"] == "identity / bare grpc.aio, heavy payload, c=32")
    assert ident["value"] == pytest.approx(0.55) and (ident["min"], ident["max"]) == (0.5, 0.6)
    assert ident["rounds"] == pytest.approx([0.5, 0.6, 0.55]) and limit["rows_per_call_c32"] is None
    previous = {"targets": found}
    fell, _ = report.targets(rounds((1000, 1100, 1200)), (32,))  # 0.275: below 0.55 by more than 0.1 + 0.05
    held, _ = report.targets(rounds((2000, 2100, 1900)), (32,))  # 0.5: within the spread
    assert [c["fell"] for c in report.compare(previous, fell) if c["target"] == ident["target"]] == [True]
    assert [c["fell"] for c in report.compare(previous, held) if c["target"] == ident["target"]] == [False]
    assert report.compare(None, held) == []
    doc = {"compared_with": report.compare(previous, fell), "previous": {"file": "serve-x.json", "git": "abc"}}
    text = "\n".join(report._comparison(doc))
    assert "fell by more than its spread: identity / bare grpc.aio, heavy payload, c=32" in text


def test_echo_server_parses_and_echoes_each_input_and_its_ratios_are_reported(plan, tmp_path):
    """The echo reference answers what it was sent (dtype, shape, values); the report sets identity against it and
    it against bare, and the one-core limit over its transport cost."""
    import numpy as np

    from bench.serve.endpoints import grpc_reply
    from bench.serve.models import request_bytes
    from tfship.core import protocol

    request = tmp_path / "request.bin"
    request.write_bytes(request_bytes("m", "x", (5,), rows=2))
    with ReferenceEndpoint("echo_server", ["--response-file", str(request)], None) as server:
        answer = protocol.PredictResponse.FromString(grpc_reply(server.grpc_target, request.read_bytes()))
        levels = loadgen(plan, server, request)
    sent = protocol.PredictRequest.FromString(request.read_bytes()).inputs["x"]
    out = answer.outputs["x"]
    assert out.dtype == sent.dtype and [d.size for d in out.tensor_shape.dim] == [2, 5]
    np.testing.assert_array_equal(np.frombuffer(out.tensor_content, np.float32),
                                  np.frombuffer(sent.tensor_content, np.float32))
    assert all(lvl["errors"] == 0 and lvl["requests"] > 0 for lvl in levels)
    rows = [_row("grpc", "mlp", "bare", 32, 5000), _row("grpc", "mlp", "echo", 32, 4000),
            _row("grpc", "mlp", "identity", 32, 3000), _row("grpc", "mlp", "onnx_batching", 32, 2700)]
    rows += [{"mode": "inprocess", "model": "mlp", "batch": 32, "inferences_per_s": 12000}]
    by_name = {t["target"]: t for t in report.targets(rows, (32,))[0]}
    assert by_name["hand-written echo handler / bare grpc.aio, heavy payload, c=32 (the floor)"]["value"] == 0.8
    assert by_name["identity / hand-written echo handler, heavy payload, c=32"]["value"] == 0.75
    over_echo = by_name["heavy: tfship onnx batching c=32 / one-core limit over the echo handler"]
    assert over_echo["value"] == pytest.approx(2700 * (1 / 4000 + 1 / 12000)) and over_echo["met"]

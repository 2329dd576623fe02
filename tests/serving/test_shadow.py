"""Shadow traffic end to end, with real servers on free ports and real ONNX models (built with onnx.helper).

Model `lin`: v1 the reference classifier (labelled stable), v2 the same weights (an agreeing candidate,
labelled canary), v3 the reference with one weight row changed (a planted fault), v4 a shadow that hangs and
v5 one that crashes (`shadow_models.FaultyRuntime`). Requests go through TF Serving's gRPC and REST APIs and
the Open Inference Protocol's REST API; every primary answer must equal onnxruntime's own answer for v1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shadow_models

from tfship.core import kserve_protocol
from tfship.core.errors import ConfigError
from tfship.serving.dataplane.model_config import parse_model_server_config
from tfship.serving.dataplane.shadow import parse_shadow
from tfship.serving.dataplane.types import ModelRef
from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs.client import PredictClient

MODEL = "lin"
ROOT = Path(__file__).resolve().parents[2]
PAIRS = 36  # 9 per API


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shadow") / MODEL
    w, b = shadow_models.weights()
    shadow_models.write_onnx_version(root / "1", w, b)
    shadow_models.write_onnx_version(root / "2", w.copy(), b.copy())
    faulty = w.copy()
    faulty[:, 0] += 0.5  # a planted fault: one class's weights changed, which flips some decisions
    shadow_models.write_onnx_version(root / "3", faulty, b)
    shadow_models.write_faulty_version(root / "4", "hang")
    shadow_models.write_faulty_version(root / "5", "crash")
    return root


@pytest.fixture
def lin_repo(versions: Path, tmp_path: Path) -> Path:
    """A fresh repository per test (promote rewrites its models.config): stable -> 1, canary -> 2."""
    repo = tmp_path / "repo"
    shutil.copytree(versions, repo / MODEL)
    (repo / "models.config").write_text(f"""model_config_list {{ config {{
  name: "{MODEL}" base_path: "{repo / MODEL}" model_platform: "onnx"
  model_version_policy {{ specific {{ versions: 1 versions: 2 versions: 3 versions: 4 versions: 5 }} }}
  version_labels {{ key: "stable" value: 1 }} version_labels {{ key: "canary" value: 2 }} }} }}
""")
    return repo


def _inputs(count: int, rows: int = 16) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.normal(0, 1, (rows, shadow_models.FEATURES)).astype(np.float32) for _ in range(count)]


def _reference(repo: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(repo / MODEL / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    logits, class_id = session.run(["logits", "class_id"], {"x": x})
    return {"logits": logits, "class_id": class_id}


def _http(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _send_on_every_api(server: ServerProcess, inputs: list[np.ndarray]) -> list[tuple[dict, float]]:
    """Each input to v1 (the stable label) on one of four APIs in turn (TF Serving gRPC and REST, Open Inference
    REST and gRPC); returns (answer, seconds) each."""
    answers = []
    with PredictClient(server.grpc_target, timeout_s=30) as client:
        for i, x in enumerate(inputs):
            started = time.perf_counter()
            if i % 4 == 0:
                out = client.predict(MODEL, {"x": x}, version_label="stable")
            elif i % 4 == 1:
                status, body = _http(f"{server.rest_url}/v1/models/{MODEL}/labels/stable:predict",
                                     {"inputs": {"x": x.tolist()}})
                assert status == 200, body
                out = {k: np.asarray(v) for k, v in body["outputs"].items()}
            elif i % 4 == 2:
                status, body = _http(f"{server.rest_url}/v2/models/{MODEL}/versions/1/infer", {"inputs": [
                    {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]})
                assert status == 200, body
                out = {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in body["outputs"]}
            else:
                out = _infer_grpc(server.grpc_target, x)
            answers.append((out, time.perf_counter() - started))
    return answers


def _infer_grpc(target: str, x: np.ndarray) -> dict[str, np.ndarray]:
    """Open Inference Protocol ModelInfer over gRPC (version 1), answer decoded from raw or typed contents."""
    request = kserve_protocol.ModelInferRequest(model_name=MODEL, model_version="1")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    with grpc.insecure_channel(target) as channel:
        answer = channel.unary_unary(f"/{kserve_protocol.SERVICE}/ModelInfer",
                                     request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=kserve_protocol.ModelInferResponse.FromString)(
            request, timeout=30)
    dtypes = {"FP32": np.float32, "INT64": np.int64}
    out = {}
    for index, output in enumerate(answer.outputs):
        if answer.raw_output_contents:
            values = np.frombuffer(answer.raw_output_contents[index], dtypes[output.datatype])
        else:
            values = np.asarray(output.contents.fp32_contents if output.datatype == "FP32"
                                else output.contents.int64_contents, dtypes[output.datatype])
        out[output.name] = values.reshape(list(output.shape))
    return out


def _assert_primary_unchanged(repo: Path, inputs: list[np.ndarray], answers) -> None:
    for x, (out, _) in zip(inputs, answers, strict=True):
        want = _reference(repo, x)
        np.testing.assert_array_equal(np.asarray(out["logits"], np.float32), want["logits"])
        np.testing.assert_array_equal(np.asarray(out["class_id"], np.int64), want["class_id"])


def _report_when(server: ServerProcess, done, timeout_s: float = 30.0, model: str = MODEL) -> dict:
    """Poll the JSON endpoint until `done(report)` (shadow work is asynchronous); fail with the last report."""
    end = time.monotonic() + timeout_s
    while True:
        status, report = _http(f"{server.rest_url}/v1/shadow/{model}")
        assert status == 200, report
        if done(report) or time.monotonic() > end:
            return report
        time.sleep(0.1)


def _serve(repo: Path, *flags: str) -> ServerProcess:
    return ServerProcess(repo, MODEL, module="tests.serving.shadow_models", extra_args=(
        "--model-config-file", str(repo / "models.config"), "--file-system-poll-wait-seconds", "0",
        "--shadow-rate", "1", "--shadow-report-dir", str(repo / "shadow"), *flags))


def _tfship(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfship.pipeline.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})


def _labels(repo: Path) -> dict[str, int]:
    return parse_model_server_config((repo / "models.config").read_text())[0].labels


def _accounted(report: dict) -> int:
    return report["pairs"] + sum(report["errors"].values()) + sum(report["dropped"].values())


def test_agreeing_candidate_is_promoted_from_its_shadow(lin_repo: Path) -> None:
    inputs = _inputs(PAIRS)
    with _serve(lin_repo, "--shadow", f"{MODEL}=canary") as server:
        answers = _send_on_every_api(server, inputs)
        report = _report_when(server, lambda r: r["pairs"] >= PAIRS)
        _assert_primary_unchanged(lin_repo, inputs, answers)
        figures = report["figures"]
        assert (figures["pairs"], figures["top1_agreement"], figures["value_agreement"]) == (PAIRS, 1.0, 1.0)
        assert figures["shadow_versions"] == [2] and report["versions"]["primary"] == {"1": PAIRS}
        assert report["errors"] == {} and report["worst"] == []
        assert figures["outputs"]["logits"]["max_error"] == 0.0
        table = _tfship("shadow-report", MODEL, "--source", server.rest_url)
        assert table.returncode == 0, table.stderr
        assert "top-1 agreement" in table.stdout and "100.00%" in table.stdout
        metrics = urllib.request.urlopen(f"{server.rest_url}/monitoring/prometheus/metrics").read().decode()
        assert f'tfship_shadow_pairs_total{{model="{MODEL}"}} {float(PAIRS)}' in metrics
        promoted = _tfship("promote", MODEL, "2", "--label", "stable", "--repository", str(lin_repo),
                           "--evidence", "shadow", "--shadow-report", server.rest_url, "--min-pairs", str(PAIRS),
                           "--min-value-agreement", "1.0")
    assert promoted.returncode == 0, promoted.stderr
    assert _labels(lin_repo) == {"stable": 2, "canary": 2}
    record = json.loads((lin_repo / MODEL / "promotions.json").read_text())[-1]
    assert record["version"] == 2 and record["previous"] == 1
    assert record["evidence"]["kind"] == "shadow" and record["evidence"]["passed"]
    assert record["evidence"]["figures"]["pairs"] == PAIRS


def test_planted_fault_is_refused_with_its_figures(lin_repo: Path) -> None:
    inputs = _inputs(PAIRS)
    with _serve(lin_repo, "--shadow", f"{MODEL}=3") as server:
        answers = _send_on_every_api(server, inputs)
        report = _report_when(server, lambda r: r["pairs"] >= PAIRS)
        _assert_primary_unchanged(lin_repo, inputs, answers)
    # the server stopped: the report is read back from the part it wrote when it drained
    refused = _tfship("promote", MODEL, "3", "--label", "stable", "--repository", str(lin_repo),
                      "--evidence", "shadow", "--shadow-report", str(lin_repo / "shadow"), "--min-pairs", str(PAIRS))
    figures = report["figures"]
    assert figures["pairs"] == PAIRS and figures["shadow_versions"] == [3]
    assert figures["top1_agreement"] < 0.99 and figures["value_agreement"] == 0.0
    assert report["worst"] and report["worst"][0]["shadow_version"] == 3 and "inputs" not in report["worst"][0]
    assert refused.returncode != 0
    assert "PromotionRefusedError" in refused.stderr and f"top-1 agreement {figures['top1_agreement']:.2%}" \
        in refused.stderr, refused.stderr
    assert _labels(lin_repo) == {"stable": 1, "canary": 2}
    assert not (lin_repo / MODEL / "promotions.json").exists()


@pytest.mark.parametrize(("version", "status"), [(4, "DEADLINE_EXCEEDED"), (5, "INTERNAL")])
def test_hanging_or_crashing_shadow_changes_no_primary_answer(lin_repo: Path, version: int, status: str) -> None:
    """A primary that waited on its shadow at all would take the shadow's 2 s limit or more: every primary
    answer comes back well below it, and equal to onnxruntime's."""
    inputs = _inputs(PAIRS)
    with _serve(lin_repo, "--shadow", f"{MODEL}={version}", "--shadow-timeout-s", "2",
                "--shadow-queue-size", "2") as server:
        answers = _send_on_every_api(server, inputs)
        report = _report_when(server, lambda r: _accounted(r) >= PAIRS)
    _assert_primary_unchanged(lin_repo, inputs, answers)
    assert max(seconds for _, seconds in answers) < 2.0
    assert report["pairs"] == 0 and report["errors"].get(status, 0) >= 1 and _accounted(report) == PAIRS
    if status == "DEADLINE_EXCEEDED":  # one worker held 2 s per call: the rest of the sampled requests dropped
        assert report["dropped"].get("queue_full", 0) >= 1


def test_workers_write_one_report(lin_repo: Path) -> None:
    """`--num-processes 2`: each worker writes its part; the endpoint answers the merged report."""
    inputs = _inputs(PAIRS)
    with _serve(lin_repo, "--shadow", f"{MODEL}=canary", "--num-processes", "2") as server:
        for x in inputs:  # a new connection per request: SO_REUSEPORT spreads them over both workers
            status, _ = _http(f"{server.rest_url}/v1/models/{MODEL}/labels/stable:predict", {"inputs": {"x": x.tolist()}})
            assert status == 200
        report = _report_when(server, lambda r: r["pairs"] >= PAIRS and r.get("parts") == 2)
    parts = sorted((lin_repo / "shadow").glob(f"{MODEL}.*.json"))  # both workers wrote their part on draining
    assert report["pairs"] == PAIRS and report.get("parts") == 2 and len(parts) == 2
    assert report["figures"]["top1_agreement"] == 1.0
    assert sum(json.loads(p.read_text())["pairs"] for p in parts) == PAIRS


@pytest.mark.parametrize(("flag", "named"), [
    ("other=canary", "--shadow names model(s) ['other'] that are not served; served: ['lin']"),
    # version 9 is in no folder and no version policy: it never loads, so the start is refused, naming it
    ("lin=9", "--shadow lin=9 names no loaded version of model lin: Servable not found for request: "
              "Specific(lin, 9); available versions: [1, 2, 3]"),  # 4 and 5 need the test's `faulty` backend
    ("lin=beta", "--shadow lin=beta names no loaded version of model lin: "),
])
def test_bad_shadow_setting_stops_the_start(lin_repo: Path, flag: str, named: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tfship.serving", "serve", "--model-config-file",
                           str(lin_repo / "models.config"), "--port", "0", "--rest-port", "-1", "--metrics-port",
                           "-1", "--shadow", flag], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    assert named in done.stderr, done.stderr


def test_default_report_folder_is_removed_at_stop(lin_repo: Path, tmp_path: Path) -> None:
    """Without --shadow-report-dir the parts go to `<temp>/tfship-shadow/<grpc port>/`, the server's own folder:
    written while it runs, removed (with the empty `tfship-shadow`) when it stops. A given folder is kept
    (`test_planted_fault_is_refused_with_its_figures` reads it after the stop)."""
    temp = tmp_path / "temp"
    temp.mkdir()
    server = ServerProcess(lin_repo, MODEL, module="tests.serving.shadow_models", env={**os.environ, "TMPDIR": str(temp)},
                           extra_args=("--model-config-file", str(lin_repo / "models.config"),
                                       "--file-system-poll-wait-seconds", "0", "--shadow-rate", "1",
                                       "--shadow", f"{MODEL}=canary"))
    with server:
        folder = temp / "tfship-shadow" / server.grpc_target.rsplit(":", 1)[1]
        _send_on_every_api(server, _inputs(4))
        _report_when(server, lambda r: r["pairs"] >= 4)
        end = time.monotonic() + 10
        while not list(folder.glob(f"{MODEL}.*.json")) and time.monotonic() < end:  # written once a second
            time.sleep(0.1)
        assert len(list(folder.glob(f"{MODEL}.*.json"))) == 1
    assert not (temp / "tfship-shadow").exists(), sorted(temp.rglob("*"))


@pytest.mark.parametrize(("flag", "named"), [
    ("lin", "--shadow 'lin': expected MODEL=VERSION or MODEL=LABEL"),
    ("lin=", "--shadow 'lin=': expected MODEL=VERSION or MODEL=LABEL"),
    ("lin=0", "--shadow 'lin=0': version must be positive"),
])
def test_bad_shadow_value_is_named(flag: str, named: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)):
        parse_shadow(flag)
    assert parse_shadow("lin=canary") == ("lin", ModelRef("lin", label="canary"))
    assert parse_shadow("lin=3") == ("lin", ModelRef("lin", version=3))


def test_shadow_from_the_environment(monkeypatch) -> None:
    """TFSHIP_SERVING_SHADOW (every serve flag has its variable) takes comma-separated MODEL=TARGET items."""
    import argparse

    from tfship.serving.cli import add_serve_arguments, settings_from_args

    monkeypatch.setenv("TFSHIP_SERVING_SHADOW", "lin=canary, other=3")
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    settings = settings_from_args(parser.parse_args(["--repository", "/tmp", "--model-name", "lin"]))
    assert settings.shadow == ("lin=canary", "other=3")


@pytest.mark.parametrize("backend", ["saved_model", "tflite", "onnx"])
def test_every_backend_shadows_and_judges_by_the_gate_rules(repository: Path, model_config_file: Path,
                                                           backend: str) -> None:
    """The digits models of conftest (v1; v2 = v1 with every logit + 1.0, labelled canary) on each backend:
    every pair is compared; top-1 agrees (a constant shift keeps every argmax), the value bound does not
    (logits and probabilities moved, class_id did not)."""
    repo, config = repository, model_config_file  # conftest's session models: one build for the whole suite
    images = np.random.default_rng(2).random((6, 8, 8, 1), dtype=np.float32)
    with ServerProcess(repo, "digits", backend=backend, extra_args=(
            "--model-config-file", str(config), "--file-system-poll-wait-seconds", "0", "--shadow", "digits=canary",
            "--shadow-rate", "1")) as server:
        with PredictClient(server.grpc_target, timeout_s=30) as client:
            for _ in range(4):
                client.predict("digits", {"image": images}, version_label="stable")
        report = _report_when(server, lambda r: r["pairs"] >= 4, model="digits")
    figures = report["figures"]
    assert figures["pairs"] == 4 and figures["shadow_versions"] == [2] and report["errors"] == {}
    assert figures["top1_agreement"] == 1.0 and figures["value_agreement"] == 0.0
    assert figures["outputs"]["class_id"]["value_agreement"] == 1.0
    assert abs(figures["outputs"]["logits"]["max_error"] - 1.0) < 1e-4


def test_clients_nan_inputs_are_no_fault_of_an_identical_candidate(lin_repo: Path) -> None:
    """NaN and Inf inputs (accepted, as TF Serving does) make the primary's logits NaN: the byte-identical
    candidate (v2) repeats them and is promoted; the planted fault (v3) is still caught on the finite rows."""
    inputs = _inputs(8)
    for i, x in enumerate(inputs):
        x[i % 3, :] = np.nan
        x[(i % 3) + 3, 0] = np.inf
    for version, promotes in ((2, True), (3, False)):
        repo = lin_repo.parent / f"repo{version}"
        shutil.copytree(lin_repo, repo)
        (repo / "models.config").write_text((lin_repo / "models.config").read_text().replace(str(lin_repo), str(repo)))
        with _serve(repo, "--shadow", f"{MODEL}={version}") as server:
            with PredictClient(server.grpc_target, timeout_s=30) as client:
                for x in inputs:
                    assert np.isnan(client.predict(MODEL, {"x": x}, version_label="stable")["logits"]).any()
            body = '{"inputs": {"x": [[' + ", ".join(["NaN"] * shadow_models.FEATURES) + "]]}}"
            request = urllib.request.Request(f"{server.rest_url}/v1/models/{MODEL}/labels/stable:predict",
                                             data=body.encode(), method="POST")
            assert urllib.request.urlopen(request, timeout=30).status == 200
            report = _report_when(server, lambda r: r["pairs"] >= 9)
            done = _tfship("promote", MODEL, str(version), "--label", "stable", "--repository", str(repo),
                           "--evidence", "shadow", "--shadow-report", server.rest_url, "--min-pairs", "9")
        assert report["pairs"] == 9 and report["errors"] == {}
        if promotes:
            assert report["figures"]["top1_agreement"] == 1.0 and report["figures"]["value_agreement"] == 1.0
            assert done.returncode == 0, done.stderr
        else:
            assert report["figures"]["top1_agreement"] < 1.0 and report["figures"]["value_agreement"] < 0.5
            assert done.returncode != 0 and "PromotionRefusedError" in done.stderr, done.stderr
        assert _labels(repo)["stable"] == (version if promotes else 1)

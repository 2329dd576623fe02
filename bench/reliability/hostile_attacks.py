"""Attacks of the hostile-load round: one protocol starving another, client values echoed back unbounded,
REST bodies the server cannot represent, secrets that must rotate, SIGTERM mid-body, memory kept after
large requests. One `Row` each for `make reliability` (bench/reliability/run.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np

from bench.reliability.common import MODEL, Row, images, rss_mb
from bench.serve import mixed_load as mixed
from tfship.core import kserve_protocol as kp
from tfship.core import protocol
from tfship.core.echo import MESSAGE_BYTES
from tfship.serving.dataplane.tensors import to_tensor_proto
from tfship.serving.launcher import ServerProcess

SIZES = (10_000, 100_000, 1_000_000)


def mixed_load(source: Path, window_s: float, repeats: int) -> Row:
    """gRPC vs REST, V2 gRPC vs V2 REST, small vs large: each side alone and together (bench/serve/mixed_load)."""
    row = Row("mixed_load", "each protocol's throughput and p99 alone and under a saturating mix")
    results = mixed.run(source, list(mixed.PAIRS), window_s, repeats=repeats)
    for result in results:
        for side in result["sides"]:
            row.check(side["holds"], f"{result['pair']} {side['label']}: share {side['share']}, p99 "
                                     f"x{side['p99_ratio']} ({side['mixed']['p99_ms']} ms mixed)")
    row.notes = " | ".join(mixed.describe(r) for r in results)
    return row


def _grpc_code(channel, method: str, request) -> tuple[str, str]:
    call = channel.unary_unary(method, request_serializer=lambda m: m.SerializeToString())
    try:
        call(request, timeout=60)
        return "OK", ""
    except grpc.RpcError as err:
        return err.code().name, err.details() or ""


def _post(url: str, body: bytes, token: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _predict(**spec) -> protocol.PredictRequest:
    request = protocol.PredictRequest()
    request.model_spec.name = spec.pop("model", MODEL)
    request.model_spec.signature_name = spec.pop("signature", "")
    request.inputs["image"].CopyFrom(to_tensor_proto(images(1)["image"]))
    for name in spec.pop("extra_inputs", ()):
        request.inputs[name].CopyFrom(to_tensor_proto(images(1)["image"]))
    request.output_filter.extend(spec.pop("output_filter", ()))
    return request


def bounded_echoes(source: Path) -> Row:
    """Names of 10 KB, 100 KB and 1 MB in every echoed field, both protocols: the status the field calls for and
    a message of at most `MESSAGE_BYTES` (was RESOURCE_EXHAUSTED 'metadata size exceeds hard limit', 1 MB bodies)."""
    row = Row("bounded_echoes", "huge client names: right status, bounded message (gRPC, REST, V2)")
    predict, infer = f"/{protocol.PREDICTION_SERVICE}/Predict", f"/{kp.SERVICE}/ModelInfer"
    with ServerProcess(source, MODEL, backend="tflite", extra_args=("--request-log-sampling-rate", "1")) as server, \
            grpc.insecure_channel(server.grpc_target) as channel:
        image = images(1)["image"]
        for size in SIZES:
            big, many = "n" * size, [f"x{i:07d}" for i in range(size // 8)]
            v2 = kp.ModelInferRequest(model_name=big)
            v2.inputs.add(name="image", datatype="FP32", shape=[1, 8, 8, 1]).contents.fp32_contents.extend(
                image.reshape(-1).tolist())
            grpc_cases = [("model name", predict, _predict(model=big), "NOT_FOUND"),
                          ("signature", predict, _predict(signature=big), "INVALID_ARGUMENT"),
                          ("input names", predict, _predict(extra_inputs=many), "INVALID_ARGUMENT"),
                          ("output_filter", predict, _predict(output_filter=[big]), "INVALID_ARGUMENT"),
                          ("V2 model name", infer, v2, "NOT_FOUND")]
            for what, method, request, expected in grpc_cases:
                code, details = _grpc_code(channel, method, request)
                row.check(code == expected and len(details.encode()) <= MESSAGE_BYTES,
                          f"gRPC {what} of {size} chars: {code}, {len(details)} chars")
            rows = [image[0].tolist()]
            rest_cases = [("signature_name", {"signature_name": big, "instances": rows}),
                          ("input name", {"inputs": {"image": rows, big: [1.0]}}),
                          ("output_filter", {"instances": rows, "output_filter": [big]})]
            for what, body in rest_cases:
                status, text = _post(f"{server.rest_url}/v1/models/{MODEL}:predict", json.dumps(body).encode())
                row.check(status == 400 and len(text) <= MESSAGE_BYTES + 64,
                          f"REST {what} of {size} chars: {status}, {len(text)} bytes")
        lines = [line for line in server.stderr_tail(2000).splitlines() if '"protocol"' in line]
        longest = max((len(line) for line in lines), default=0)
        row.check(bool(lines) and longest <= 4096, f"longest request-log line {longest} chars")
    row.notes = f"{row.tried - 1} requests at {', '.join(f'{s:,}' for s in SIZES)} chars; longest log line {longest}"
    return row


def _image_text(first: str) -> str:
    values = [first] + ["0.0"] * 63
    rows = ",".join("[" + ",".join(f"[{v}]" for v in values[r * 8:(r + 1) * 8]) + "]" for r in range(8))
    return f"[{rows}]"


def unrepresentable_bodies(source: Path) -> Row:
    """Bodies numpy cannot hold or that would be read as ±Infinity: 400 naming why; explicit tokens accepted."""
    row = Row("unrepresentable_bodies", "nesting past 64 dims, 1,000-deep arrays, 1e309/1e39, data+binary")
    data = ",".join(["0.0"] * 64)

    def v2(first: str, extra: str = "") -> bytes:
        return (f'{{"inputs":[{{"name":"image","datatype":"FP32","shape":[1,8,8,1],"data":[{first},{data[4:]}]'
                f'{extra}}}]}}').encode()

    predict, infer = f"/v1/models/{MODEL}:predict", f"/v2/models/{MODEL}/infer"
    cases = [("65 deep", predict, ('{"instances": ' + "[" * 65 + "0" + "]" * 65 + "}").encode(), 400),
             ("bare 1,000 deep", predict, ("[" * 1000 + "]" * 1000).encode(), 400),
             ("1e309", predict, ('{"instances": [' + _image_text("1e309") + "]}").encode(), 400),
             ("-1e309", predict, ('{"instances": [' + _image_text("-1e309") + "]}").encode(), 400),
             ("1e39 float32", predict, ('{"instances": [' + _image_text("1e39") + "]}").encode(), 400),
             ("Infinity token", predict, ('{"instances": [' + _image_text("Infinity") + "]}").encode(), 200),
             ("NaN token", predict, ('{"instances": [' + _image_text("NaN") + "]}").encode(), 200),
             ("V2 1e309", infer, v2("1e309"), 400), ("V2 1e39", infer, v2("1e39"), 400),
             ("V2 Infinity", infer, v2("Infinity"), 200),
             ("V2 data + binary_data_size", infer, v2("0.5", ',"parameters":{"binary_data_size":0}'), 400)]
    with ServerProcess(source, MODEL, backend="tflite") as server:
        for what, route, body, expected in cases:
            status, text = _post(server.rest_url + route, body)
            row.check(status == expected, f"{what}: {status} {text[:160]!r}")
    return row


def _kubernetes_secret(folder: Path, version: int, text: str) -> Path:
    data = folder / f"..{version}"
    data.mkdir()
    (data / "tokens").write_text(text)
    (folder / "..data_tmp").symlink_to(data.name)
    os.replace(folder / "..data_tmp", folder / "..data")
    if not (folder / "tokens").is_symlink():
        (folder / "tokens").symlink_to("..data/tokens")
    return folder / "tokens"


def secret_rotation(source: Path, work: Path, rounds: int) -> Row:
    """A token revoked by a Kubernetes-style Secret update stops working within seconds, without a restart;
    an emptied Secret keeps the running tokens."""
    row = Row("secret_rotation", "token files re-read on change (..data swap); empty update refused")
    secret = work / "rotating-secret"
    secret.mkdir(exist_ok=True)
    tokens = _kubernetes_secret(secret, 0, "token-0\n")
    body = json.dumps({"instances": [images(1)["image"][0].tolist()]}).encode()
    took = []
    with ServerProcess(source, MODEL, backend="tflite", extra_args=("--auth-token-file", str(tokens))) as server:
        url = f"{server.rest_url}/v1/models/{MODEL}:predict"
        for version in range(1, rounds + 1):
            _kubernetes_secret(secret, version, f"token-{version}\n")
            started = time.monotonic()
            while _post(url, body, f"token-{version - 1}")[0] != 401 and time.monotonic() - started < 15:
                time.sleep(0.1)
            took.append(time.monotonic() - started)
            row.check(took[-1] < 15 and _post(url, body, f"token-{version}")[0] == 200,
                      f"rotation {version}: old token still accepted after {took[-1]:.1f}s")
        _kubernetes_secret(secret, rounds + 1, "# emptied\n")
        time.sleep(5)
        row.check(_post(url, body, f"token-{rounds}")[0] == 200, "an emptied Secret turned the running tokens off")
    row.notes = f"old token refused {min(took):.1f}-{max(took):.1f}s after each swap (poll every 2 s)"
    return row


def sigterm_mid_body(source: Path, tries: int, grace_s: float = 3.0) -> Row:
    """SIGTERM while a client is half-way through a 20 MB body: gone within the grace period plus 2.5 s."""
    row = Row("sigterm_mid_body", f"exit time after SIGTERM with half a 20 MB body sent (--grace-period-s {grace_s})")
    times = []
    for _ in range(tries):
        with ServerProcess(source, MODEL, backend="saved_model", extra_args=("--grace-period-s", str(grace_s))) as s:
            size = 20 << 20
            with socket.create_connection(("127.0.0.1", s.ports["rest"]), timeout=10) as conn:
                conn.sendall(f"POST /v1/models/{MODEL}:predict HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n"
                             "Content-Type: application/json\r\n\r\n".encode() + b" " * (size // 2))
                started = time.monotonic()
                s.process.send_signal(signal.SIGTERM)
                s.process.wait(grace_s + 60)
                times.append(time.monotonic() - started)
            row.check(s.process.returncode == 0 and times[-1] <= grace_s + 2.5,
                      f"exit {s.process.returncode} after {times[-1]:.1f}s")
    row.notes = f"exited {min(times):.1f}-{max(times):.1f}s after SIGTERM"
    return row


def memory_after_large_bodies(source: Path, rounds: int) -> Row:
    """RSS after large REST bodies (20 MB of JSON each, four at once) settles back near where it started."""
    row = Row("memory_after_large_bodies", "RSS before / after / settled around 20 MB REST bodies")
    rows = np.random.default_rng(0).random((1000, 8, 8, 1), dtype=np.float32).round(6).tolist()
    body = (json.dumps({"instances": rows}) + " " * (20 << 20)).encode()  # whitespace: a 20 MB body, 1,000 rows
    with ServerProcess(source, MODEL, backend="tflite") as server:
        url = f"{server.rest_url}/v1/models/{MODEL}:predict"
        _post(url, body)
        before = rss_mb(server.process.pid)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(4) as pool:
            for _ in range(rounds):
                codes = list(pool.map(lambda _: _post(url, body)[0], range(4)))
                row.check(codes == [200] * 4, f"large bodies answered {codes}")
        after = rss_mb(server.process.pid)
        time.sleep(2)
        settled = rss_mb(server.process.pid)
        row.check(settled - before < 150, f"RSS stayed {settled - before:.0f} MiB above ({before:.0f} -> {settled:.0f})")
    row.notes = f"RSS {before:.0f} -> {after:.0f} -> {settled:.0f} MiB (before, after {rounds * 4} bodies, 2 s later)"
    return row

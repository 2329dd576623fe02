"""Attacks of the hostile-load round: one protocol starving another, client values echoed back unbounded,
REST bodies the server cannot represent, secrets that must rotate, SIGTERM mid-body, memory kept after
large requests, large bodies beside medium ones, memory after refused large gRPC requests. One `Row` each for `make reliability` (bench/reliability/run.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np

from bench.reliability.common import MODEL, Row, descendants, images, rss_mb
from bench.reliability.serving_attacks import make_certs
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
    an emptied Secret keeps the running tokens; a client CA replaced in `--tls-client-ca` is refused on REST
    and gRPC (`_client_ca_rotation`)."""
    row = Row("secret_rotation", "token files re-read on change (..data swap); empty update refused; a client CA "
                                 "taken out of --tls-client-ca refused")
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
    ca_took = _client_ca_rotation(source, work, row)
    row.notes = (f"old token refused {min(took):.1f}-{max(took):.1f}s after each swap (poll every 2 s); "
                 f"a removed client CA refused on REST and gRPC {ca_took:.1f}s after the file was replaced")
    return row


def _client_ca_rotation(source: Path, work: Path, row: Row) -> float:
    """Mutual TLS: replace the `--tls-client-ca` file (CA one out, CA two in) under a running server; returns
    the seconds until a client of CA one was refused on both ports and a client of CA two answered."""
    one, two = make_certs(work / "client-ca-one"), make_certs(work / "client-ca-two")
    client_ca = work / "client-ca.pem"
    client_ca.write_bytes((one / "ca.pem").read_bytes())

    def rest(client: Path) -> bool:
        context = ssl.create_default_context(cafile=str(one / "ca.pem"))
        context.load_cert_chain(client / "client.pem", client / "client.key")
        try:
            with urllib.request.urlopen(f"{server.rest_url}/v1/models/{MODEL}", timeout=10, context=context) as r:
                return r.status == 200
        except (urllib.error.URLError, ssl.SSLError, ConnectionError):
            return False

    def grpc_ok(client: Path) -> bool:
        credentials = grpc.ssl_channel_credentials((one / "ca.pem").read_bytes(), (client / "client.key").read_bytes(),
                                                   (client / "client.pem").read_bytes())
        request = protocol.GetModelStatusRequest()
        request.model_spec.name = MODEL
        with grpc.secure_channel(server.grpc_target, credentials) as channel:
            try:
                channel.unary_unary("/tensorflow.serving.ModelService/GetModelStatus",
                                    request_serializer=lambda m: m.SerializeToString())(request, timeout=10)
                return True
            except grpc.RpcError:
                return False

    credentials = grpc.ssl_channel_credentials((one / "ca.pem").read_bytes(), (one / "client.key").read_bytes(),
                                               (one / "client.pem").read_bytes())
    with ServerProcess(source, MODEL, backend="tflite", credentials=credentials,
                       extra_args=("--tls-cert", str(one / "server.pem"), "--tls-key", str(one / "server.key"),
                                   "--tls-client-ca", str(client_ca))) as server:
        row.check(rest(one) and grpc_ok(one), "a client of the configured CA was refused")
        row.check(not rest(two) and not grpc_ok(two), "a client of an untrusted CA was answered")
        staged = work / "client-ca.new"
        staged.write_bytes((two / "ca.pem").read_bytes())
        os.replace(staged, client_ca)
        started = time.monotonic()
        while not (rest(two) and grpc_ok(two)) and time.monotonic() - started < 15:
            time.sleep(0.2)
        took = time.monotonic() - started
        row.check(rest(two) and grpc_ok(two), f"a client of the new CA still refused {took:.1f}s after the swap")
        row.check(not rest(one), "HTTPS still trusts the client CA taken out of --tls-client-ca")
        row.check(not grpc_ok(one), "gRPC still trusts the client CA taken out of --tls-client-ca")
    return took


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


def _tree_rss_mb(pid: int) -> float:
    """RSS of the server and its helper processes together, MiB."""
    return rss_mb(pid) + sum(rss_mb(child) for child in descendants(pid))


def _typed_predict(rows: int) -> bytes:
    """A serialized digits Predict of `rows` rows in typed `float_val` (the kind decoded off the event loop)."""
    shape = protocol.TensorProto(dtype=protocol.DATA_TYPE.values_by_name["DT_FLOAT"].number)
    for size in (rows, 8, 8, 1):
        shape.tensor_shape.dim.add().size = size
    values = np.full(rows * 64, 0.5, np.float32).tobytes()
    length, varint = len(values), bytearray()
    while True:  # float_val (field 5), packed: tag, varint length, the raw floats
        varint.append((length & 0x7F) | (0x80 if length > 0x7F else 0))
        length >>= 7
        if not length:
            break
    tensor = protocol.TensorProto.FromString(shape.SerializeToString() + b"\x2a" + bytes(varint) + values)
    request = protocol.PredictRequest()
    request.model_spec.name = MODEL
    request.inputs["image"].CopyFrom(tensor)
    return request.SerializeToString()


def memory_after_refused_grpc(source: Path, threads: int = 4, calls: int = 3) -> Row:
    """Concurrent 64 MB gRPC Predicts refused for their batch: refused before decoding, and their memory handed
    back at once (they used to hold 3 GB at the peak and 1.7 GB after, until the garbage collector ran)."""
    row = Row("memory_after_refused_grpc", f"RSS around {threads}x{calls} concurrent 64 MB gRPC Predicts above the "
                                           "row limit")
    data = _typed_predict(250_000)  # 64 MB of float_val
    with ServerProcess(source, MODEL, backend="tflite") as server:
        pid = server.process.pid
        before, peak, done = _tree_rss_mb(pid), [0.0], threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _tree_rss_mb(pid))
                time.sleep(0.05)

        options = [("grpc.max_send_message_length", 128 << 20), ("grpc.max_receive_message_length", 128 << 20)]
        with grpc.insecure_channel(server.grpc_target, options=options) as channel:
            call = channel.unary_unary(protocol.method_path(protocol.PREDICTION_SERVICE, "Predict"))
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()

            def client(_) -> list[tuple[str, str]]:
                answers = []
                for _ in range(calls):
                    try:
                        call(data, timeout=120)
                        answers.append(("OK", ""))
                    except grpc.RpcError as err:
                        answers.append((err.code().name, err.details() or ""))
                return answers

            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(threads) as pool:
                answers = [a for batch in pool.map(client, range(threads)) for a in batch]
            done.set()
            watcher.join()
        after = _tree_rss_mb(pid)
        time.sleep(2)
        settled = _tree_rss_mb(pid)
    for code, details in answers:
        row.check(code == "INVALID_ARGUMENT" and details.startswith("batch of 250000 rows exceeds"),
                  f"{code}: {details[:120]}")
    row.check(settled - before < 150, f"RSS stayed {settled - before:.0f} MiB above ({before:.0f} -> {settled:.0f})")
    row.notes = (f"server + helpers RSS {before:.0f} MiB before, peak {peak[0]:.0f}, {after:.0f} after, {settled:.0f}"
                 f" 2 s later; {len(answers)} answers")
    return row


def large_beside_medium(source: Path, rounds: int = 5, attackers: int = 3) -> Row:
    """A client's 1.5 MB REST bodies while `attackers` clients loop 60 MB bodies: the medium body keeps its
    latency (one decoding helper once made it wait 16-30 s; the large bodies now have their own lane)."""
    row = Row("large_beside_medium", f"1.5 MB REST bodies beside {attackers} clients looping 60 MB bodies")
    rows = np.random.default_rng(0).random((1000, 8, 8, 1), dtype=np.float32).round(6).tolist()
    medium = json.dumps({"instances": rows}).encode()
    medium = medium + b" " * max(0, 1_500_000 - len(medium))
    refused = json.dumps({"instances": [[[[0.5]] * 8] * 8] * 128_000}).encode()  # 60 MB, above the row limit
    valid = json.dumps({"instances": rows}).encode()
    valid = valid + b" " * (60_000_000 - len(valid))  # 60 MB that decodes and runs
    with ServerProcess(source, MODEL, backend="tflite") as server, grpc.insecure_channel(server.grpc_target) as chan:
        url = f"{server.rest_url}/v1/models/{MODEL}:predict"
        predict_path = protocol.method_path(protocol.PREDICTION_SERVICE, "Predict")

        def one_of_each() -> tuple[float, float]:
            """(seconds for a 1.5 MB REST body, seconds for a 1-row gRPC Predict)."""
            started = time.monotonic()
            row.check(_post(url, medium)[0] == 200, "medium body refused")
            between = time.monotonic()
            row.check(_grpc_code(chan, predict_path, _predict())[0] == "OK", "1-row gRPC Predict failed")
            return between - started, time.monotonic() - between

        one_of_each()  # the helpers start
        alone = [one_of_each() for _ in range(rounds)]
        stop, attack_codes = threading.Event(), []

        def attacker(index: int) -> None:
            while not stop.is_set():
                attack_codes.append(_post(url, valid if index == 0 else refused)[0])

        threads = [threading.Thread(target=attacker, args=(i,), daemon=True) for i in range(attackers)]
        for thread in threads:
            thread.start()
        time.sleep(3)  # the large lane is busy
        mixed = [one_of_each() for _ in range(rounds)]
        stop.set()
        for thread in threads:
            thread.join(120)
    notes = []
    for index, what in enumerate(("1.5 MB REST body", "1-row gRPC Predict")):
        worst, typical = max(m[index] for m in mixed), sorted(a[index] for a in alone)[len(alone) // 2]
        row.check(worst <= max(1.0, 5 * typical), f"a {what} took {worst:.2f} s beside the large ones "
                                                  f"({typical:.2f} s alone)")
        notes.append(f"{what} {typical * 1000:.0f} ms alone (median), worst {worst * 1000:.0f} ms beside")
    row.check(set(attack_codes) <= {200, 400} and bool(attack_codes), f"large bodies answered {set(attack_codes)}")
    row.notes = (f"{'; '.join(notes)} {attackers} clients looping 60 MB bodies ({len(attack_codes)} answered: "
                 f"{ {c: attack_codes.count(c) for c in sorted(set(attack_codes))} })")
    return row

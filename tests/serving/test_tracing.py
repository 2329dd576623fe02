"""OpenTelemetry tracing with a real OTLP/HTTP receiver on loopback (decoded with the OpenTelemetry proto
classes), a real server (ONNX, batching on) and clients that send a W3C `traceparent` over REST and gRPC.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import numpy as np
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shadow_models

from tfship.core import protocol
from tfship.core.errors import ConfigError
from tfship.serving.dataplane.tensors import to_tensor_proto
from tfship.serving.launcher import ServerProcess
from tfship.serving.operations import tracing

MODEL = "lin"
REST_TRACE, REST_PARENT = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
GRPC_TRACE, GRPC_PARENT = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


class Receiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces with an ExportTraceServiceRequest (protobuf)."""

    def __init__(self) -> None:
        self.spans: list = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                message = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                owner.spans += [s for r in message.resource_spans for ss in r.scope_spans for s in ss.spans]
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def trace(self, trace_id: str) -> dict[str, object]:
        return {s.name: s for s in self.spans if s.trace_id.hex() == trace_id}


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("traced")
    shadow_models.write_onnx_version(repo / MODEL / "1", *shadow_models.weights())
    return repo


def _predict_rest(server: ServerProcess, x: np.ndarray) -> None:
    request = urllib.request.Request(f"{server.rest_url}/v1/models/{MODEL}:predict", method="POST",
                                     data=json.dumps({"inputs": {"x": x.tolist()}}).encode(),
                                     headers={"traceparent": f"00-{REST_TRACE}-{REST_PARENT}-01"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200


def _predict_grpc(server: ServerProcess, x: np.ndarray) -> None:
    request = protocol.PredictRequest()
    request.model_spec.name = MODEL
    request.inputs["x"].CopyFrom(to_tensor_proto(x))
    with grpc.insecure_channel(server.grpc_target) as channel:
        call = channel.unary_unary("/tensorflow.serving.PredictionService/Predict",
                                   request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=protocol.PredictResponse.FromString)
        call(request, timeout=30, metadata=[("traceparent", f"00-{GRPC_TRACE}-{GRPC_PARENT}-01")])


def test_spans_reach_a_real_otlp_receiver_with_parentage_and_links(repository: Path) -> None:
    receiver = Receiver()
    env = {**os.environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50",
           "OTEL_SERVICE_NAME": "tfship-test"}
    x = np.random.default_rng(0).normal(size=(3, shadow_models.FEATURES)).astype(np.float32)
    with ServerProcess(repository, MODEL, backend="onnx", env=env, extra_args=(
            "--enable-batching", "--request-log-sampling-rate", "1", "--file-system-poll-wait-seconds", "0")) as server:
        _predict_rest(server, x)
        _predict_grpc(server, x)
        end = time.monotonic() + 20
        while time.monotonic() < end and not ({"encode", "queue wait"} <= set(receiver.trace(REST_TRACE))
                                               and "encode" in receiver.trace(GRPC_TRACE)):
            time.sleep(0.05)
        log = server.stderr_tail(200)
    rest = receiver.trace(REST_TRACE)
    assert {"decode", "predict", "runtime call", "queue wait", "encode"} <= set(rest), sorted(rest)
    (transport,) = [s for n, s in rest.items() if n.startswith("POST /v1/models/")]
    assert transport.parent_span_id.hex() == REST_PARENT and transport.kind == transport.SPAN_KIND_SERVER
    for child in ("predict", "encode"):
        assert rest[child].parent_span_id == transport.span_id, child
    # the transports decode against the version the data plane holds (`predict_decoded`): decode is its child
    assert rest["decode"].parent_span_id == rest["predict"].span_id
    assert rest["runtime call"].parent_span_id == rest["predict"].span_id
    assert rest["queue wait"].parent_span_id == rest["runtime call"].span_id
    attributes = {a.key: a.value for a in rest["predict"].attributes}
    assert attributes["tfship.model"].string_value == MODEL and attributes["tfship.version"].int_value == 1
    (link,) = rest["queue wait"].links
    batch = next(s for s in receiver.spans if s.span_id == link.span_id)
    assert batch.name == "batch" and batch.trace_id != transport.trace_id
    size = {a.key: a.value.int_value for a in batch.attributes}
    assert size["tfship.batch.size"] == 3 and size["tfship.batch.requests"] == 1
    assert [bl.span_id for bl in batch.links] == [rest["queue wait"].span_id]
    grpc_spans = receiver.trace(GRPC_TRACE)
    served = grpc_spans["tensorflow.serving.PredictionService/Predict"]
    assert served.parent_span_id.hex() == GRPC_PARENT
    for child in ("predict", "encode"):
        assert grpc_spans[child].parent_span_id == served.span_id, child
    assert grpc_spans["decode"].parent_span_id == grpc_spans["predict"].span_id
    assert grpc_spans["encode"].start_time_unix_nano >= grpc_spans["predict"].end_time_unix_nano
    assert f'"trace_id": "{REST_TRACE}"' in log and f'"trace_id": "{GRPC_TRACE}"' in log


@pytest.mark.parametrize(("env", "named"), [
    ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER='jaeger'"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"}, "OTEL_EXPORTER_OTLP_ENDPOINT='collector:4317'"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER='sometimes'"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
     "OTEL_TRACES_SAMPLER_ARG='2'"),
])
def test_bad_configuration_is_a_named_error(env: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        tracing._check_env(env)


def test_off_by_default_and_when_asked() -> None:
    assert tracing._check_env({}) is None
    assert tracing._check_env({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}) is None
    assert tracing._check_env({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}) is None
    on = tracing._check_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
                             "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                             "OTEL_TRACES_SAMPLER_ARG": "0.01"})
    assert on == {"exporters": ["otlp"], "protocol": "grpc", "sampler": "parentbased_traceidratio", "ratio": 0.01,
                  "service": "tfship"}


def test_server_refuses_to_start_on_a_bad_value(repository: Path) -> None:
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "zipkin"}
    done = subprocess.run([sys.executable, "-m", "tfship.serving", "serve", "--repository", str(repository),
                           "--model-name", MODEL, "--port", "0", "--rest-port", "-1"], env=env, capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 2, done.stderr
    assert "OTEL_TRACES_EXPORTER='zipkin'" in done.stderr


def test_tracing_without_the_sdk_is_a_start_up_error_naming_the_extra() -> None:
    """The edge image leaves the `tracing` extra out: asked to trace there, the server stops and names it."""
    probe = ("import sys; sys.modules['opentelemetry.sdk'] = None\n"
             "from tfship.core.errors import ConfigError\n"
             "from tfship.serving.operations import tracing\n"
             "assert tracing.configure({}) is False\n"
             "try:\n"
             "    tracing.configure({'OTEL_TRACES_EXPORTER': 'console'})\n"
             "except ConfigError as err:\n"
             "    print(err)\n"
             "    raise SystemExit(err.exit_code)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "tfship[tracing]" in done.stdout

"""REST transport (aiohttp), TF Serving's REST API, plus the Prometheus metrics endpoint.

Routes: `GET /v1/models/{name}[/versions/{v}|/labels/{l}]` (status), `.../metadata`, and
`POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict` with `instances` (row) or `inputs`
(columnar) JSON, `{"b64": ...}` for binary strings; `:classify` / `:regress` with `examples` (and `context`)
of tf.Example features (`serving.tfs.examples`). Errors: `{"error": "..."}` with the error's
`http_status`. JSON values are converted to the signature's dtypes, as TF Serving does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import ssl
import uuid

from aiohttp import http_exceptions, web, web_protocol
from google.protobuf import json_format

from tfship.core import protocol
from tfship.core.echo import cap_message, clip, echo_json
from tfship.core.errors import InvalidRequestError, RequestTimeoutError, ResourceExhaustedError, TfshipError
from tfship.serving.dataplane.admission import batched_inputs, rows_over_limit
from tfship.serving.dataplane.offload import Offloader
from tfship.serving.dataplane.service import DataPlane, RequestGate
from tfship.serving.dataplane.types import InferenceRequest, ModelMetadata, ModelRef
from tfship.serving.kserve.rest import add_v2_routes
from tfship.serving.operations import tracing
from tfship.serving.operations.metrics import CONTENT_TYPE, Metrics
from tfship.serving.operations.request_log import RequestLog
from tfship.serving.operations.security import AccessPolicy
from tfship.serving.tfs import converters, examples, json_write, rest_json
from tfship.serving.tfs.cors import cors_middleware
from tfship.serving.tfs.shadow_route import add_shadow_routes

log = logging.getLogger(__name__)
_MAX_BYTES = web.AppKey("max_bytes", int)
PROMETHEUS_PATH = "/monitoring/prometheus/metrics"  # TF Serving's path (--monitoring_config_file)
_SPEC = r"{name:[^/:]+}{sel:(/versions/[0-9]+|/labels/[^/:]+)?}"  # ASCII digits only (not \d: "１")


def _ref(request: web.Request) -> ModelRef:
    name, sel = request.match_info["name"], request.match_info.get("sel") or ""
    if sel.startswith("/versions/"):
        return ModelRef(name, version=int(sel.rsplit("/", 1)[1]))
    if sel.startswith("/labels/"):
        return ModelRef(name, label=sel.rsplit("/", 1)[1])
    return ModelRef(name)


def error_response(message: str, status: int) -> web.Response:
    """`{"error": message}` as TF Serving writes it (json_tensor.cc MakeJsonFromStatus: RapidJSON's PrettyWriter,
    4-space indent, non-ASCII as UTF-8): the key on its own line after `{`, indented by four spaces, `}` on
    the last line.
    """
    text = '{\n    "error": ' + json.dumps(message, ensure_ascii=False) + "\n}"
    # a message echoing what no UTF-8 can hold (a lone surrogate) is sent escaped, never a failed answer
    body = text.encode("utf-8", "backslashreplace")
    return web.Response(body=body, status=status, content_type="application/json", charset="utf-8")


def _error_middleware(policy: AccessPolicy, gate: RequestGate | None = None,
                      request_log: RequestLog | None = None, release_after=None):
    @web.middleware
    async def middleware(request: web.Request, handler):
        entered = False
        logged = _start_request_log(request_log, request)
        response = None
        try:
            policy.check(request.headers.get("Authorization", ""))
            if gate is not None:
                gate.enter()  # 503 while draining
                entered = True
            response = await handler(request)
        except web.HTTPException as err:
            response = _http_error(request, err)
        except TfshipError as err:
            response = error_response(cap_message(str(err)), err.http_status)
            response[_GRPC_CODE] = err.grpc_code
        except ConnectionError as err:  # the client reset or closed the connection mid-body: not our incident
            log.info("REST client closed the connection during %s %s: %s", request.method, request.path,
                     type(err).__name__)
            response = error_response("the client closed the connection", 400)
            response[_GRPC_CODE] = "CANCELLED"
        except Exception:
            incident = uuid.uuid4().hex[:12]
            log.exception("unexpected REST error (incident %s)", incident)
            response = error_response(f"internal server error (incident {incident})", 500)
        finally:
            if entered:
                gate.leave()
            if release_after is not None and request.content_length:
                release_after(request.content_length)  # a large body's heap goes back to the OS
            if logged is not None:
                status = response.status if response is not None else 500
                code = response.get(_GRPC_CODE) if response is not None else None
                request_log.finish(logged, code or _CODE_OF_HTTP.get(status, "UNKNOWN"), status)
        return response

    return middleware


_GRPC_CODE = web.ResponseKey("grpc_code", str)
# HTTP status -> gRPC code name for answers that carry no TfshipError (aiohttp's own refusals, success).
_CODE_OF_HTTP = {200: "OK", 400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                 404: "NOT_FOUND", 408: "DEADLINE_EXCEEDED", 413: "RESOURCE_EXHAUSTED", 429: "RESOURCE_EXHAUSTED",
                 500: "INTERNAL", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def _start_request_log(request_log: RequestLog | None, request: web.Request):
    """Open this request's log record when the server logs requests and this one is sampled."""
    if request_log is None or request_log.sampling_rate <= 0.0:
        return None
    route = request.match_info.route
    method = request.match_info.get("verb") or getattr(route.handler, "__name__", "") or request.method
    peer = request.transport.get_extra_info("peername") if request.transport else None
    peer_text = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else (request.remote or "")
    return request_log.start("rest", method, peer_text, request.match_info.get("name", ""))


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The request body, received within `timeout_s` seconds (TF Serving's --rest_api_timeout_in_ms).

    Raises:
        RequestTimeoutError: the client did not send the whole body in time (HTTP 408).
        InvalidRequestError: the body does not decode as its `Content-Encoding` / transfer framing says (400).
    """
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise RequestTimeoutError(f"request body not received within {timeout_s:g} s "
                                  "(--rest-api-timeout-in-ms); send the whole body at once") from None
    except (http_exceptions.BadHttpMessage, web_protocol.RequestPayloadError) as err:
        if isinstance(err, http_exceptions.DecompressSizeError):
            raise
        encoding = clip(request.headers.get("Content-Encoding", "identity"), 40)
        reason = " ".join(str(getattr(err, "message", None) or err).split())  # aiohttp's words, on one line,
        reason = reason.removeprefix(f"{getattr(err, 'code', 400)}, message: ")  # less its exception's repr
        raise InvalidRequestError(f"request body cannot be read (Content-Encoding: {encoding}): {clip(reason)}"
                                  ) from None


# TF Serving hands only paths matching kHTTPRestApiHandlerPathRegex `(?i)/v1/.*` (http_rest_api_util.h) to its REST
# handler; any other path gets libevent's own 404 page (evhttp_server.cc: evhttp_send_error(req, HTTP_NOTFOUND,
# nullptr), whose body is libevent's ERR_FORMAT page for "404 Not Found").
_TFS_PATHS = re.compile(r"(?i)/v1/.*")
_NOT_FOUND_PAGE = ("<HTML><HEAD>\n<TITLE>404 Not Found</TITLE>\n</HEAD><BODY>\n<H1>Not Found</H1>\n"
                   "</BODY></HTML>\n")


def _http_error(request: web.Request, err: web.HTTPException) -> web.Response:
    """Aiohttp's own refusals in TF Serving's shape: under `/v1/`, no route / wrong method is 400 `Malformed
    request: GET /v1/foo` (http_rest_api_handler.cc ProcessRequest's default status); a path outside `/v1/` (and
    outside tfship's own `/v2/` and metrics routes) is 404 with libevent's HTML page, as TF Serving answers it.
    """
    if err.status in (404, 405):
        if err.status == 404 and not _TFS_PATHS.fullmatch(request.path) and not request.path.startswith("/v2/"):
            return web.Response(text=_NOT_FOUND_PAGE, status=404, content_type="text/html")
        return error_response(f"Malformed request: {clip(request.method)} {clip(request.path)}", 400)
    if err.status == 413:
        limit = request.app.get(_MAX_BYTES)
        size = f"{request.content_length} bytes" if request.content_length else "above the limit"
        return error_response(f"request body of {size} exceeds --max-message-bytes {limit} bytes", 413)
    return error_response(cap_message(str(err.reason)), err.status)


def _output_filter(body: dict) -> tuple[str, ...]:
    """`output_filter` as a tuple of names; a single string is a one-name list (a tfship extension)."""
    names = body.get("output_filter")
    if names is None:
        return ()
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InvalidRequestError(f"'output_filter' must be a list of output names, got {echo_json(names, 100)}")
    return tuple(names)


def _json_text(payload: dict, max_bytes: int) -> str:
    """Serialise `payload` (NaN/Infinity as TF Serving writes them); refuse a body above `max_bytes`.

    Raises:
        ResourceExhaustedError: the JSON body is larger than --max-message-bytes (names both sizes).
    """
    text = json_write.dumps(payload)  # floats as TF Serving writes them (serving.tfs.json_write)
    if len(text) > max_bytes:
        raise ResourceExhaustedError(f"response of {len(text)} bytes (JSON) exceeds --max-message-bytes "
                                     f"{max_bytes}; ask for fewer rows or outputs (output_filter)")
    return text


def encode_predict(outputs: dict, rows: bool, batch: int | None, max_bytes: int) -> str:
    """A predict answer's JSON text (runs inline or in the helper process); raises as `_json_text`."""
    return _json_text(rest_json.response_json(outputs, rows, batch), max_bytes)


def _proto_json(message) -> dict:
    """A proto as TF Serving's REST handler prints it: proto field names, fields without presence included."""
    return json_format.MessageToDict(message, always_print_fields_with_no_presence=True,
                                     preserving_proto_field_name=True)


def decode_predict(raw: bytes, signatures: dict | None, max_rows: int = 0):
    """A `:predict` body -> (signature name, output_filter, inputs, row format?, batch); inputs are None when
    `signatures` is None (the model was not found). Runs inline or in the helper process (`serving.dataplane.offload`).

    `max_rows`: --max-batch-per-request (0 = unlimited), judged on the parsed lists' lengths before their values
    are converted (`serving.dataplane.admission`).

    Raises:
        InvalidRequestError: bad JSON, bad fields, an unknown signature, a batch above `max_rows` or inputs that
            do not convert.
    """
    body = rest_json.parse_body(raw)
    signature_name = rest_json.signature_name(body)
    output_filter = _output_filter(body)
    if signatures is None:
        return signature_name, output_filter, None, False, None
    if signature_name not in signatures:
        raise InvalidRequestError(f'Serving signature name: "{clip(signature_name)}" not found in signature def; '
                                  f"available: {sorted(signatures)}")
    rows = _listed_rows(body, signatures[signature_name])
    if max_rows and rows is not None and rows > max_rows:
        raise rows_over_limit(rows, max_rows)
    inputs, rows = rest_json.request_inputs(body, signatures[signature_name])
    return signature_name, output_filter, inputs, rows, len(body["instances"]) if rows else None


def _listed_rows(body: dict, signature) -> int | None:
    """The batch a parsed `:predict` body declares, from list lengths alone (None when it declares none): the
    `instances` count, or the length of the first batched input's list in `inputs` (a bare list when the
    signature's only input is batched). Malformed bodies give None here and their error later.
    """
    batched = batched_inputs(signature)
    if not batched:
        return None
    listed = body.get("instances", body.get("inputs"))
    if "instances" not in body:
        if isinstance(listed, dict):
            listed = next((listed[name] for name in batched if name in listed), None)
        elif len(signature.inputs) != 1:
            return None
    return len(listed) if isinstance(listed, list) else None


def build_app(dataplane: DataPlane, policy: AccessPolicy | None = None, max_bytes: int = 64 << 20,
              metrics: Metrics | None = None, metrics_path: str = PROMETHEUS_PATH,
              timeout_s: float = 30.0, offloader: Offloader | None = None, cors: bool = False) -> web.Application:
    """The TF Serving REST API over `dataplane`, under `policy` (bearer tokens; None = open).

    `cors`: TF Serving's --rest_api_enable_cors_support (`serving.tfs.cors`).

    With `metrics`, Prometheus text is also served at `metrics_path` (TF Serving's `/monitoring/prometheus/metrics`
    unless --monitoring_config_file names another). A request body must arrive within `timeout_s` seconds
    (else HTTP 408). Large bodies and answers are decoded / encoded by `offloader` (default: the data plane's
    helper process, `serving.dataplane.offload`), so they never stall the event loop.
    """
    offloader = offloader or dataplane.offloader

    async def status(request: web.Request) -> web.Response:
        statuses = await dataplane.model_status(_ref(request))
        return web.json_response(_proto_json(converters.status_response(statuses)))

    async def metadata(request: web.Request) -> web.Response:
        meta = await dataplane.metadata(_ref(request))
        proto = converters.metadata_response(meta)
        defs = protocol.SignatureDefMap()
        proto.metadata["signature_def"].Unpack(defs)
        return web.json_response({"model_spec": _proto_json(proto.model_spec),
                                  "metadata": {"signature_def": _proto_json(defs)}})

    async def predict(request: web.Request) -> web.Response:
        raw = await read_body(request, timeout_s)
        ref = _ref(request)
        answer_layout = {}  # how the JSON answer is laid out: row format? and the `instances` count

        async def decode(meta: ModelMetadata | None) -> InferenceRequest | None:
            signature_name, output_filter, inputs, rows, batch = await offloader.run_if_large(
                len(raw), decode_predict, raw, dict(meta.signatures) if meta else None,
                dataplane.limits.max_batch_per_request)
            answer_layout.update(rows=rows, batch=batch)
            return InferenceRequest(model=ref, inputs=inputs, signature_name=signature_name,
                                    output_filter=output_filter) if meta else None

        response = await dataplane.predict_decoded(ref, decode)  # one version: decoded against, run on
        rows, batch = answer_layout["rows"], answer_layout["batch"]
        outputs = dict(response.outputs)
        text = await offloader.run_if_large(sum(a.nbytes for a in outputs.values()) * 4,  # JSON: ~4x the bytes
                                            encode_predict, outputs, rows, batch, max_bytes)
        return web.Response(text=text, content_type="application/json")

    async def classify_or_regress(request: web.Request) -> web.Response:
        body = rest_json.parse_body(await read_body(request, timeout_s))
        verb = request.match_info["verb"]
        inference = examples.rest_request(body, verb, _ref(request), rest_json.signature_name(body))
        answer = examples.rest_response(await dataplane.infer_examples(inference))
        return web.Response(text=_json_text(answer, max_bytes), content_type="application/json")

    policy = policy or AccessPolicy()
    middlewares = [_error_middleware(policy, dataplane.gate, dataplane.request_log,
                                     getattr(dataplane, "release_after", None))]
    app = web.Application(middlewares=[cors_middleware, *middlewares] if cors else middlewares,
                          client_max_size=max_bytes)
    if metrics is not None:
        app.router.add_get(metrics_path, _metrics_handler(metrics))
    app[_MAX_BYTES] = max_bytes
    base = "/v1/models/" + _SPEC
    app.router.add_get("/v1/models", _missing_model_name)
    app.router.add_get(base, status)
    app.router.add_get(base + "/metadata", metadata)
    app.router.add_post(base + ":predict", predict)
    app.router.add_post(base + ":{verb:classify|regress}", classify_or_regress)
    add_v2_routes(app, dataplane, lambda request: read_body(request, timeout_s))  # Open Inference Protocol
    add_shadow_routes(app, dataplane)  # GET /v1/shadow/<model>: the shadow report (serving.tfs.shadow_route)
    app.middlewares.extend(tracing.aiohttp_middlewares())  # spans per request when OTEL_* turn tracing on
    return app


async def _missing_model_name(request: web.Request) -> web.Response:
    """`GET /v1/models`: TF Serving's status regex matches it with an empty name (http_rest_api_handler.cc
    ProcessModelStatusRequest).
    """
    raise InvalidRequestError("Missing model name in request.")


def _metrics_handler(metrics: Metrics):
    async def handler(request: web.Request) -> web.Response:
        body = await asyncio.to_thread(metrics.render)  # large registries never stall the event loop
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    return handler


async def _start(app: web.Application, settings, port: int, ssl_context: ssl.SSLContext | None
                 ) -> tuple[web.AppRunner, int]:
    timeout_s = settings.rest_api_timeout_in_ms / 1000
    # keepalive_timeout also closes connections that never finish sending their headers (slow clients);
    # shutdown_timeout bounds how long a SIGTERM waits for handlers (the grace period)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=timeout_s,
                           shutdown_timeout=settings.grace_period_s)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, port, ssl_context=ssl_context, reuse_port=settings.reuse_port or None)
    await site.start()
    return runner, runner.addresses[0][1]


async def start_rest(dataplane: DataPlane, settings, policy: AccessPolicy, metrics: Metrics,
                     ssl_context: ssl.SSLContext | None) -> tuple[web.AppRunner, int]:
    """Start the REST API on `settings.host:settings.rest_port` (0 = any free), HTTPS when `ssl_context` is
    given, under `policy`; returns (runner, bound port).
    """
    prometheus = settings.prometheus_path  # None: --monitoring_config_file turned it off
    app = build_app(dataplane, policy, settings.max_message_bytes, metrics if prometheus else None,
                    prometheus or PROMETHEUS_PATH, settings.rest_api_timeout_in_ms / 1000,
                    cors=settings.rest_api_enable_cors_support)
    return await _start(app, settings, settings.rest_port, ssl_context)


async def start_metrics(metrics: Metrics, settings, policy: AccessPolicy,
                        ssl_context: ssl.SSLContext | None) -> tuple[web.AppRunner, int]:
    """Serve Prometheus text at `/metrics` and `/monitoring/prometheus/metrics` on `settings.metrics_port`, under
    the same TLS and token policy as the other ports; returns (runner, bound port).
    """
    app = web.Application(middlewares=[_error_middleware(policy)])
    app.router.add_get("/metrics", _metrics_handler(metrics))
    app.router.add_get(PROMETHEUS_PATH, _metrics_handler(metrics))
    return await _start(app, settings, settings.metrics_port, ssl_context)

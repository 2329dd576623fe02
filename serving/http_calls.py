"""HTTP call plumbing shared by both REST APIs (TF Serving's and the Open Inference Protocol's), as `grpc_calls`
is for gRPC: a protocol-neutral host that each API adds its routes to (MLServer's and KServe's model servers
compose their REST protocols on one host the same way).

`new_app` builds the aiohttp application: the one error middleware (the single place errors become HTTP answers:
a `TfshipError` answers its `http_status` with `{"error": message}`, message capped at `core.echo.MESSAGE_BYTES`;
anything else 500 with a generic message, detail logged), the bearer-token policy, the drain gate, the request log
and the body-size limit. `read_body` reads a body within the REST timeout; `start_app` binds an app to a port.
What a path no route takes is answered is the composer's choice (`Unrouted`): on tfship's REST port, TF Serving's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import uuid
from collections.abc import Callable, Sequence

from aiohttp import http_exceptions, web, web_protocol
from aiohttp.typedefs import Handler
from aiohttp.web_urldispatcher import _default_expect_handler  # aiohttp's own `Expect` answer (100 Continue / 417)

from tfship.core.echo import cap_message, clip
from tfship.core.errors import InvalidRequestError, RequestTimeoutError, TfshipError
from tfship.serving.operations.metrics import CONTENT_TYPE, Metrics
from tfship.serving.operations.request_log import RequestLog
from tfship.serving.operations.security import AccessPolicy, Policy

log = logging.getLogger(__name__)
MAX_BYTES = web.AppKey("max_bytes", int)
GRPC_CODE = web.ResponseKey("grpc_code", str)
# HTTP status -> gRPC code name for answers that carry no TfshipError (aiohttp's own refusals, success).
_CODE_OF_HTTP = {200: "OK", 400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                 404: "NOT_FOUND", 408: "DEADLINE_EXCEEDED", 413: "RESOURCE_EXHAUSTED", 429: "RESOURCE_EXHAUSTED",
                 500: "INTERNAL", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
# How a request no route takes (aiohttp's 404, or 405 for a wrong method) is answered.
Unrouted = Callable[[web.Request, web.HTTPException], web.Response]


def error_response(message: str, status: int) -> web.Response:
    """`{"error": message}`, the error body of both REST APIs (TF Serving's; the Open Inference Protocol's
    `{"error": "<message>"}`), laid out as TF Serving writes it (json_tensor.cc MakeJsonFromStatus: RapidJSON's
    PrettyWriter, 4-space indent, non-ASCII as UTF-8): the key on its own line after `{`, indented by four
    spaces, `}` on the last line.
    """
    text = '{\n    "error": ' + json.dumps(message, ensure_ascii=False) + "\n}"
    # a message echoing what no UTF-8 can hold (a lone surrogate) is sent escaped, never a failed answer
    body = text.encode("utf-8", "backslashreplace")
    return web.Response(body=body, status=status, content_type="application/json", charset="utf-8")


def plain_unrouted(request: web.Request, err: web.HTTPException) -> web.Response:
    """The default `Unrouted`: aiohttp's status (404 / 405) with `{"error": "no route: METHOD PATH"}`."""
    return error_response(f"no route: {clip(request.method)} {clip(request.path)}", err.status)


def _http_error(request: web.Request, err: web.HTTPException, unrouted: Unrouted) -> web.Response:
    """Aiohttp's own refusals as JSON errors: no route / wrong method as `unrouted` says, a body above the limit
    413 naming both sizes, anything else with aiohttp's status and reason.
    """
    if err.status in (404, 405):
        return unrouted(request, err)
    if err.status == 413:
        return _too_large(request)
    return error_response(cap_message(str(err.reason)), err.status)


def _too_large(request: web.Request) -> web.Response:
    """413 naming the limit and the size that exceeds it: the declared body (`Content-Length`), or, for a
    compressed body (`Content-Encoding` gzip / deflate / br), its decompressed size, which is what the limit
    bounds (aiohttp stops decompressing once it passes the limit: memory stays bounded).
    """
    limit = request.app.get(MAX_BYTES)
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    declared = request.content_length
    if encoding not in ("", "identity") and (declared is None or declared <= (limit or 0)):
        wire = f"{declared} bytes as sent" if declared is not None else "sent chunked"
        message = (f"decompressed request body exceeds --max-message-bytes {limit} bytes "
                   f"(Content-Encoding: {clip(encoding, 40)}, {wire})")
    else:
        size = f"{declared} bytes" if declared else "above the limit"
        message = f"request body of {size} exceeds --max-message-bytes {limit} bytes"
    response = error_response(message, 413)
    response[GRPC_CODE] = "RESOURCE_EXHAUSTED"
    return response


def declared_too_large(request: web.Request) -> web.Response | None:
    """The 413 answer for a request whose declared `Content-Length` exceeds --max-message-bytes (answered
    before any of its body is read), else None.
    """
    limit = request.app.get(MAX_BYTES)
    declared = request.content_length
    if limit is None or declared is None or declared <= limit:
        return None
    return _too_large(request)


async def expect_within_limit(request: web.Request) -> web.StreamResponse | None:
    """The routes' `expect_handler`: a request with `Expect: 100-continue` whose declared body exceeds the limit
    is answered 413 instead of `100 Continue` (RFC 9110 10.1.1: a server may answer the final status at once);
    otherwise aiohttp's own answer (100 Continue, or 417 for an unknown expectation).
    """
    return declared_too_large(request) or await _default_expect_handler(request)


def _answer_error(request: web.Request, err: BaseException, unrouted: Unrouted) -> web.Response:
    """The answer for an exception a handler raised (the single error-mapping point of both REST APIs)."""
    if isinstance(err, web.HTTPException):
        return _http_error(request, err, unrouted)
    if isinstance(err, TfshipError):
        response = error_response(cap_message(str(err)), err.http_status)
        response[GRPC_CODE] = err.grpc_code
        return response
    if isinstance(err, ConnectionError):  # the client reset or closed the connection mid-body: not our incident
        log.info("REST client closed the connection during %s %s: %s", request.method, request.path,
                 type(err).__name__)
        response = error_response("the client closed the connection", 400)
        response[GRPC_CODE] = "CANCELLED"
        return response
    incident = uuid.uuid4().hex[:12]
    log.error("unexpected REST error (incident %s)", incident, exc_info=err)
    return error_response(f"internal server error (incident {incident})", 500)


def error_middleware(policy: Policy, gate=None, request_log: RequestLog | None = None,
                     release_after: Callable[[int], None] | None = None, unrouted: Unrouted = plain_unrouted):
    """The host's middleware: token check, drain gate (`gate.enter()`: 503 while draining), errors as answers,
    the request log's record, and `release_after(body bytes)` once a request is done.
    """
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        entered = False
        logged = _start_request_log(request_log, request)
        response: web.StreamResponse | None = None
        try:
            policy.check(request.headers.get("Authorization", ""))
            response = declared_too_large(request)  # before the body is read: no wait for a body refused anyway
            if response is not None:
                return response
            if gate is not None:
                gate.enter()
                entered = True
            response = await handler(request)
        except Exception as err:  # noqa: BLE001 - every error becomes an answer here (see _answer_error)
            response = _answer_error(request, err, unrouted)
        finally:
            if entered and gate is not None:
                gate.leave()
            if release_after is not None and request.content_length:
                release_after(request.content_length)  # a large body's heap goes back to the OS
            if logged is not None and request_log is not None:
                status = response.status if response is not None else 500
                code = response.get(GRPC_CODE) if response is not None else None
                request_log.finish(logged, code or _CODE_OF_HTTP.get(status, "UNKNOWN"), status)
        assert response is not None  # the handler's answer or, when it raised, the error's
        return response

    return middleware


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
        if request.content.is_eof():  # the parser has the whole body: the read waits for nothing (no timer)
            return await request.read()
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


def new_app(dataplane=None, policy: Policy | None = None, max_bytes: int = 64 << 20,
            unrouted: Unrouted = plain_unrouted, outer: Sequence = ()) -> web.Application:
    """An aiohttp app with the host's middleware (under `outer` middlewares, e.g. CORS) and no routes yet.

    `dataplane`: its `gate`, `request_log` and `release_after` join the middleware (None: the metrics port).
    `max_bytes`: the body-size limit (aiohttp answers 413 above it, reworded here).
    """
    middleware = error_middleware(policy or AccessPolicy(), getattr(dataplane, "gate", None),
                                  getattr(dataplane, "request_log", None), getattr(dataplane, "release_after", None),
                                  unrouted)
    app = web.Application(middlewares=[*outer, middleware], client_max_size=max_bytes)
    app[MAX_BYTES] = max_bytes
    return app


def metrics_handler(metrics: Metrics):
    """A handler answering the Prometheus text of `metrics` (rendered off the event loop)."""
    async def handler(request: web.Request) -> web.Response:
        body = await asyncio.to_thread(metrics.render)  # large registries never stall the event loop
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    return handler


async def start_app(app: web.Application, settings, port: int, ssl_context: ssl.SSLContext | None
                    ) -> tuple[web.AppRunner, int]:
    """Serve `app` on `settings.host:port` (0 = any free), HTTPS with `ssl_context`; returns (runner, bound port).

    `settings`: `serving.settings.ServerSettings` (its REST timeout, grace period and --reuse-port apply).
    """
    timeout_s = settings.rest_api_timeout_in_ms / 1000
    # keepalive_timeout also closes connections that never finish sending their headers (slow clients);
    # shutdown_timeout bounds how long a SIGTERM waits for handlers (the grace period)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=timeout_s,
                           shutdown_timeout=settings.grace_period_s)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, port, ssl_context=ssl_context, reuse_port=settings.reuse_port or None)
    await site.start()
    return runner, runner.addresses[0][1]

"""OpenTelemetry tracing of every request, exported over OTLP; off unless the standard `OTEL_*` variables ask.

Switch (read once at start-up by `configure`, the OpenTelemetry SDK's own variable names and values):
  * on when `OTEL_TRACES_EXPORTER` is `otlp` (or `console`), or when an OTLP endpoint is set
    (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`); off when neither is set (unlike the
    SDK's auto-instrumentation, whose default exporter is otlp: a server never sends spans nobody asked for),
    when `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true`;
  * `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`: `http/protobuf` (default, as the specification says) or `grpc`;
  * `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`: the specification's samplers (default
    `parentbased_always_on`); `OTEL_SERVICE_NAME` (default `tfship`); headers, timeouts, certificates: read by
    the SDK's exporters themselves.
A value the SDK would reject or silently ignore (an unknown exporter, protocol or sampler, a ratio outside
[0, 1], an endpoint that is not an http(s) URL) stops the server at start-up with `ConfigError` naming the
variable and its value.

Spans of one request (W3C `traceparent` from HTTP headers or gRPC metadata continues the client's trace):
  `<service>/<method>` (gRPC) or `<METHOD> <route>` (REST), kind SERVER: the transport, whole request;
    `predict` (the data plane: lookup, validation, run; `tfship.model`, `tfship.version`), with children
      `decode` (wire format to tensors: every Predict transport decodes against the version the data plane
      holds, `DataPlane.predict_decoded`; calls decoded before it, e.g. Classify, get a `decode` span from the
      transport's start to the data plane's, beside `predict`), `runtime call` (`tfship.backend`,
      `tfship.rows`) and, when batching, its child `queue wait` (linked to its batch);
    `encode`: tensors to the wire format (from the data plane's answer to the transport's end).
  `batch` (its own trace; `tfship.batch.size` rows, `tfship.batch.requests`): one merged model call, linked to
  every request's `queue wait` span, which links back to it.
The trace id of each request is added to its request-log line (`trace_id`, `serving.operations.request_log`).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from tfship.core.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.trace import Span

EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf", "grpc")
SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
            "parentbased_traceidratio")
_NOOP = contextlib.nullcontext()
_tracer = None  # an opentelemetry Tracer once `configure` turned tracing on
_provider = None
_propagator = None  # W3C trace context (traceparent, tracestate), made by `configure`
# the transport's marks for the derived decode/encode spans: [transport start, data plane start, data plane end
# (ns), whether a `decode` span was recorded inside the data plane]
_MARKS: ContextVar[list | None] = ContextVar("tfship_trace_marks", default=None)


def _recording() -> bool:
    """Tracing is on and the current span records (its trace was sampled): only then are children made, so an
    unsampled request costs its transport span's sampling decision and nothing more.
    """
    current = _current_span() if _tracer is not None else None
    return current is not None and current.is_recording()


def _no_span() -> Span | None:
    return None


_current_span: Callable[[], Span | None] = _no_span  # opentelemetry's `trace.get_current_span` once tracing is on


def enabled() -> bool:
    """Whether spans are recorded (`configure` found tracing switched on)."""
    return _tracer is not None


def _check_env(env: Mapping[str, str]) -> dict | None:
    """The tracing switch from `env` as {exporters, protocol, sampler, ratio, service}; None when off.

    Raises:
        ConfigError: an unknown or malformed value (names the variable and the value).
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER")
    endpoint_var = next((v for v in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
                         if env.get(v)), None)
    if exporter is None and endpoint_var is None:
        return None
    exporters = [e.strip().lower() for e in (exporter or "otlp").split(",") if e.strip()]
    unknown = [e for e in exporters if e not in EXPORTERS]
    if unknown or not exporters:
        raise ConfigError(f"OTEL_TRACES_EXPORTER={exporter!r}: choose from {list(EXPORTERS)} (comma-separated)")
    exporters = [e for e in exporters if e != "none"]
    if not exporters:
        return None
    if endpoint_var:
        url = urlparse(env[endpoint_var])
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ConfigError(f"{endpoint_var}={env[endpoint_var]!r}: expected an http(s) URL such as "
                              "http://127.0.0.1:4318 (the OTLP receiver)")
    protocol_var = next((v for v in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
                         if env.get(v)), None)
    protocol = env[protocol_var].strip() if protocol_var else "http/protobuf"
    if protocol not in PROTOCOLS:
        raise ConfigError(f"{protocol_var}={protocol!r}: choose from {list(PROTOCOLS)} (http/json is not "
                          "supported by the OpenTelemetry Python exporters)")
    sampler = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if sampler not in SAMPLERS:
        raise ConfigError(f"OTEL_TRACES_SAMPLER={sampler!r}: choose from {list(SAMPLERS)}")
    ratio = 1.0
    if sampler.endswith("traceidratio"):
        text = env.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            ratio = float(text)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG={text!r}: a ratio in [0, 1] for {sampler}")
    return {"exporters": exporters, "protocol": protocol, "sampler": sampler, "ratio": ratio,
            "service": env.get("OTEL_SERVICE_NAME") or "tfship"}


def _sampler(name: str, ratio: float):
    from opentelemetry.sdk.trace import sampling

    base = {"always_on": sampling.ALWAYS_ON, "always_off": sampling.ALWAYS_OFF,
            "traceidratio": sampling.TraceIdRatioBased(ratio)}
    if name.startswith("parentbased_"):
        return sampling.ParentBased(base[name.removeprefix("parentbased_")])
    return base[name]


def configure(env: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on when the `OTEL_*` variables of `env` (default: the process's) ask; returns whether it is.

    Raises:
        ConfigError: a bad `OTEL_*` value (see `_check_env`).
    """
    global _tracer, _provider, _current_span, _propagator
    settings = _check_env(os.environ if env is None else env)
    if settings is None:
        return False
    try:
        import opentelemetry.sdk  # noqa: F401  (the `tracing` extra; the edge image leaves it out)
    except ImportError as err:
        raise ConfigError("OTEL_* variables ask for tracing, but the OpenTelemetry SDK is not installed: "
                          "pip install 'tfship[tracing]' (-c requirements.lock)") from err
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": settings["service"]}),
                              sampler=_sampler(settings["sampler"], settings["ratio"]))
    for name in settings["exporters"]:
        if name == "console":
            exporter = ConsoleSpanExporter()
        elif settings["protocol"] == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            exporter = OTLPSpanExporter()  # endpoint, headers, TLS: the OTEL_EXPORTER_OTLP_* variables
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            exporter = OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))  # exported off the request path
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _current_span, _propagator = trace.get_current_span, TraceContextTextMapPropagator()
    _provider, _tracer = provider, provider.get_tracer("tfship.serving")
    return True


def shutdown(timeout_ms: int = 2000) -> None:
    """Export the spans still buffered and stop (at server shutdown); tracing is off afterwards."""
    global _tracer, _provider
    if _provider is not None:
        _provider.force_flush(timeout_ms)
        _provider.shutdown()
    _tracer = _provider = None


def span(name: str, attributes: dict | None = None):
    """A context manager recording a child span of the current one (a shared no-op when tracing is off or the
    request is not sampled).
    """
    if _tracer is None or not _recording():
        return _NOOP
    return _tracer.start_as_current_span(name, attributes=attributes)


def runtime_span(backend: str, rows: int | None):
    """The `runtime call` span (`tfship.backend`, `tfship.rows`; `span`), its attributes made only when recorded."""
    tracer = _tracer
    if tracer is None or not _recording():
        return _NOOP
    return tracer.start_as_current_span("runtime call", attributes={"tfship.backend": backend,
                                                                      "tfship.rows": rows or 0})


@contextlib.contextmanager
def _server_span(name: str, carrier: Mapping[str, str], attributes: dict):
    """The transport's SERVER span, continuing the W3C `traceparent` in `carrier`, with derived `decode` (unless
    the handler times its own) and `encode` spans from the data plane's marks.
    """
    from opentelemetry import trace

    tracer, propagator = _tracer, _propagator
    assert tracer is not None and propagator is not None  # the transports' hooks exist while tracing is on
    parent = propagator.extract(carrier=carrier)
    marks = [time.time_ns(), None, None, False]
    token = _MARKS.set(marks)
    try:
        with tracer.start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER,
                                          attributes=attributes) as server:
            yield server
            if marks[1] is not None and server.is_recording():
                if not marks[3]:
                    tracer.start_span("decode", start_time=marks[0]).end(end_time=marks[1])
                tracer.start_span("encode", start_time=marks[2]).end(end_time=time.time_ns())
    finally:
        _MARKS.reset(token)


def predict_span(api: str, model: str):
    """The data plane's `predict` span (`tfship.model`; the caller adds `tfship.version`); marks its start and
    end for the transport's derived spans and notes the trace id in the request-log line. Off or unsampled: a
    shared no-op context whose value is None (one branch, no generator per request).
    """
    if not _recording():
        return _NOOP
    return _predict_span(api, model)


@contextlib.contextmanager
def _predict_span(api: str, model: str):
    """`predict_span` of a recorded request."""
    from tfship.serving.operations.request_log import note_request

    tracer = _tracer
    assert tracer is not None  # predict_span found the request recorded
    marks = _MARKS.get()
    if marks is not None:
        marks[1] = time.time_ns()
    try:
        with tracer.start_as_current_span(api, attributes={"tfship.model": model}) as current:
            context = current.get_span_context()
            if context.is_valid:
                note_request(trace_id=f"{context.trace_id:032x}")
            yield current
    finally:
        if marks is not None:
            marks[2] = time.time_ns()


def decode_span():
    """The `decode` span of a transport that decodes inside the data plane (`DataPlane.predict_decoded`)."""
    if _tracer is None or not _recording():
        return _NOOP
    marks = _MARKS.get()
    if marks is not None:
        marks[3] = True
    return _tracer.start_as_current_span("decode")


def aiohttp_middlewares() -> list:
    """[an aiohttp middleware recording each REST request's SERVER span (`<METHOD> <route>`)]; [] when off."""
    if _tracer is None:
        return []
    from aiohttp import web

    @web.middleware
    async def middleware(request, handler):
        if _tracer is None:
            return await handler(request)
        route = request.match_info.route.resource
        template = route.canonical if route is not None else request.path
        with _server_span(f"{request.method} {template}", request.headers,
                          {"http.request.method": request.method, "url.path": request.path,
                           "network.protocol.name": "http"}) as server:
            response = await handler(request)
            server.set_attribute("http.response.status_code", response.status)
            return response

    return [middleware]


def grpc_interceptors() -> list:
    """[a grpc.aio server interceptor recording each unary call's SERVER span (`<service>/<method>`)]; [] when
    off (an interceptor costs every call, even one that only passes it on).
    """
    if _tracer is None:
        return []
    import grpc

    class TracingInterceptor(grpc.aio.ServerInterceptor):
        def __init__(self) -> None:
            self._wrapped: dict[str, tuple] = {}  # method -> (its handler, the traced handler): made once

        async def intercept_service(self, continuation, details):
            handler = await continuation(details)
            if handler is None or not inspect.iscoroutinefunction(handler.unary_unary):
                return handler  # streams and synchronous handlers go untraced
            known = self._wrapped.get(details.method)
            if known is None or known[0] is not handler:
                known = self._wrapped[details.method] = (handler, _traced_handler(handler, details.method))
            return known[1]

    def _traced_handler(handler, full_method: str):
        inner, method = handler.unary_unary, full_method.lstrip("/")
        service, _, name = method.partition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}

        async def traced(request, context):
            carrier = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
            with _server_span(method, carrier, attributes):
                return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(traced, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)

    return [TracingInterceptor()]


def queued() -> tuple | None:
    """At a batching queue's door: (the request's trace context, now in ns); None when not recorded."""
    if not _recording():
        return None
    from opentelemetry import context

    return context.get_current(), time.time_ns()


def start_batch(requests: list[tuple | None], rows: int):
    """Start the `batch` span of one merged model call over `requests` (`queued()` of each): linked to each
    request's `queue wait` span, which is recorded now (queued to this moment) and links back. None when off.
    """
    if _tracer is None or not any(requests):
        return None
    from opentelemetry import trace

    now = time.time_ns()
    batch = _tracer.start_span("batch", context=trace.set_span_in_context(trace.INVALID_SPAN), start_time=now,
                               attributes={"tfship.batch.size": rows, "tfship.batch.requests": len(requests)})
    batch_link = trace.Link(batch.get_span_context())
    for entry in requests:
        if entry is None:
            continue
        parent, queued_ns = entry
        wait = _tracer.start_span("queue wait", context=parent, start_time=queued_ns, links=[batch_link])
        wait.end(end_time=now)
        batch.add_link(wait.get_span_context())
    return batch


def end(span_or_none) -> None:
    """End a span `start_batch` returned (nothing when it returned None)."""
    if span_or_none is not None:
        span_or_none.end()

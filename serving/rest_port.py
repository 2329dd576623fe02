"""The REST port: TF Serving's REST API, the Open Inference Protocol's (`/v2`) and the shadow report, composed on
the protocol-neutral host (`serving.http_calls`), plus the metrics port.

Both APIs share one aiohttp app, so the same middleware answers their errors, and the same auth, TLS, drain gate
and body-size limit apply. Paths no route takes are answered as TF Serving answers them
(`serving.tfs.rest.unrouted_answer`), `/v2/...` counted as an API's own path.
"""

from __future__ import annotations

import functools
import ssl

from aiohttp import web

from tfship.serving.dataplane.offload import Offloader
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.http_calls import metrics_handler, new_app, start_app
from tfship.serving.kserve.rest import V2_PREFIX, add_v2_routes
from tfship.serving.operations import tracing
from tfship.serving.operations.metrics import Metrics
from tfship.serving.operations.security import Policy
from tfship.serving.tfs.cors import cors_middleware
from tfship.serving.tfs.flags import PROMETHEUS_PATH  # TF Serving's path (--monitoring_config_file)
from tfship.serving.tfs.rest import add_tfs_routes, unrouted_answer
from tfship.serving.tfs.shadow_route import add_shadow_routes


def build_app(dataplane: DataPlane, policy: Policy | None = None, max_bytes: int = 64 << 20,
              metrics: Metrics | None = None, metrics_path: str = PROMETHEUS_PATH,
              timeout_s: float = 30.0, offloader: Offloader | None = None, cors: bool = False) -> web.Application:
    """TF Serving's REST API and the Open Inference Protocol's over `dataplane`, under `policy` (bearer tokens;
    None = open).

    `cors`: TF Serving's --rest_api_enable_cors_support (`serving.tfs.cors`). With `metrics`, Prometheus text is
    also served at `metrics_path` (TF Serving's `/monitoring/prometheus/metrics` unless --monitoring_config_file
    names another). A request body must arrive within `timeout_s` seconds (else HTTP 408); `max_bytes` bounds
    bodies and answers; large ones are decoded / encoded by `offloader` (default: the data plane's helper process).
    """
    app = new_app(dataplane, policy, max_bytes, functools.partial(unrouted_answer, other_apis=(V2_PREFIX,)),
                  outer=(cors_middleware,) if cors else ())
    if metrics is not None:
        app.router.add_get(metrics_path, metrics_handler(metrics))
    add_tfs_routes(app, dataplane, timeout_s, max_bytes, offloader)
    add_v2_routes(app, dataplane, timeout_s)  # Open Inference Protocol
    add_shadow_routes(app, dataplane)  # GET /v1/shadow/<model>: the shadow report (serving.tfs.shadow_route)
    app.middlewares.extend(tracing.aiohttp_middlewares())  # spans per request when OTEL_* turn tracing on
    return app


async def start_rest(dataplane: DataPlane, settings, policy: Policy, metrics: Metrics,
                     ssl_context: ssl.SSLContext | None) -> tuple[web.AppRunner, int]:
    """Start the REST port on `settings.host:settings.rest_port` (0 = any free), HTTPS when `ssl_context` is
    given, under `policy`; returns (runner, bound port).
    """
    prometheus = settings.prometheus_path  # None: --monitoring_config_file turned it off
    app = build_app(dataplane, policy, settings.max_message_bytes, metrics if prometheus else None,
                    prometheus or PROMETHEUS_PATH, settings.rest_api_timeout_in_ms / 1000,
                    cors=settings.rest_api_enable_cors_support)
    return await start_app(app, settings, settings.rest_port, ssl_context)


async def start_metrics(metrics: Metrics, settings, policy: Policy,
                        ssl_context: ssl.SSLContext | None) -> tuple[web.AppRunner, int]:
    """Serve Prometheus text at `/metrics` and `/monitoring/prometheus/metrics` on `settings.metrics_port`, under
    the same TLS and token policy as the other ports; returns (runner, bound port).
    """
    app = new_app(policy=policy, unrouted=unrouted_answer)
    app.router.add_get("/metrics", metrics_handler(metrics))
    app.router.add_get(PROMETHEUS_PATH, metrics_handler(metrics))
    return await start_app(app, settings, settings.metrics_port, ssl_context)

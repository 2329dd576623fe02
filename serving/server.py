"""Assemble and run the server: model manager, data plane, gRPC, REST and metrics transports.

Lifecycle (TF Serving's order): load every configured model (exit 1 when one has no version that loads), then
bind the ports, so health is SERVING from the first accepted connection, and write `--port-file` (with
`"ready": true`); poll the repository;
on SIGTERM/SIGINT report NOT_SERVING, let in-flight requests finish, unload, all within the grace period,
and exit 0 at once (`_drain`, `serve_process`; SIGHUP does the same).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

from tfship.core.errors import ConfigError
from tfship.core.scratch import remove_own_scratch
from tfship.serving.affinity import CoreShare
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import (
    ModelConfig,
)
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.types import ServerLimits
from tfship.serving.dataplane.version_folders import check_config
from tfship.serving.kserve.grpc_service import add_inference_service
from tfship.serving.loops import TransportLoop, bridged, watch_lag
from tfship.serving.operations import tracing
from tfship.serving.operations.metrics import Metrics
from tfship.serving.operations.request_log import RequestLog
from tfship.serving.operations.security import (
    LivePolicy,
    LiveTls,
    SecretWatcher,
    ssl_context,
    tls_material,
    warn_readable_secrets,
)
from tfship.serving.settings import ServerSettings
from tfship.serving.startup import model_configs, poll_model_config_file, runtime_wrapper, start_shadows
from tfship.serving.tfs.grpc_service import AccessInterceptor, HealthServicer, add_services
from tfship.serving.unix_socket import bind_unix_socket

log = logging.getLogger(__name__)
SERVING = health_pb2.HealthCheckResponse.SERVING
DRAIN_LINGER_S = 0.25  # after the last admitted request: time to answer requests received but not dispatched
UNLOAD_TIMEOUT_S = 1.0  # unloading after the drain (at most a quarter of the grace period): the process exits anyway
CLOSE_RESERVE_S = 1.0  # of the grace period, kept for closing the ports after the last request
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _bind_grpc(server: grpc.aio.Server, settings: ServerSettings, credentials) -> int:
    """Add the gRPC port; `ConfigError` naming the address when it cannot be bound (e.g. already in use)."""
    address = f"{settings.host}:{settings.port}"
    try:
        port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError as err:  # grpc gives no detail: a bad key/cert pair or an address in use
        raise ConfigError(f"cannot listen on gRPC port {address} (--port {settings.port}): already in use by "
                          f"another process, or a bad --tls-cert/--tls-key pair; to share the port with other "
                          f"tfship servers on purpose pass --reuse-port ({err})") from err
    if port == 0:
        raise ConfigError(f"cannot listen on gRPC port {address} (--port {settings.port}): already in use; to share "
                          "it with other tfship servers on purpose pass --reuse-port")
    return port


async def _bind_http(start, settings: ServerSettings, flag: str, port: int):
    """Await a REST/metrics `start` coroutine (None when `port` < 0); `ConfigError` naming the port if taken."""
    if port < 0:
        if start is not None:
            start.close()
        return None
    try:
        return await start
    except OSError as err:
        raise ConfigError(f"cannot listen on {settings.host}:{port} ({flag} {port}): {err.strerror or err}") from err


def _write_port_file(path: Path, ports: dict[str, int | None]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(ports))
    os.replace(tmp, path)  # atomic: readers never see a partial file


class _Health:
    """Per-model and overall ("") health: overall SERVING when every configured model has a version up."""

    def __init__(self, configured: list[str]) -> None:
        self.servicer: HealthServicer | None = None  # joined by _grpc_server, before any model loads
        self.ok: dict[str, bool] = dict.fromkeys(configured, False)
        self.names = lambda: list(configured)  # replaced by the manager's live list once it exists
        self.draining = False

    async def update(self, name: str, available: bool) -> None:
        self.ok[name] = available
        assert self.servicer is not None
        await self.servicer.set(name, SERVING if available and not self.draining else NOT_SERVING)
        await self.overall()

    async def overall(self) -> None:
        names = self.names()
        up = bool(names) and all(self.ok.get(n) for n in names) and not self.draining
        assert self.servicer is not None
        await self.servicer.set("", SERVING if up else NOT_SERVING)


@dataclass
class _Core:
    """What serves the models whatever the transport: the manager, the data plane, health and model threads."""

    manager: ModelManager
    dataplane: DataPlane
    health: _Health
    executors: tuple  # the model-load and predict thread pools

    def shutdown_executors(self) -> None:
        for executor in self.executors:
            executor.shutdown(wait=False, cancel_futures=True)


def _build_core(settings: ServerSettings, configs: list[ModelConfig], metrics: Metrics, cores: CoreShare) -> _Core:
    """The manager and data plane for `configs` (nothing loaded yet), with their thread pools and health."""
    executor = cores.executor(settings.worker_threads, thread_name_prefix="tfship-model")  # loads: every core
    # predicts hold the GIL around the model call: on the transports' core (a model's own thread pools, made
    # while it loads, keep every core)
    predict_executor = cores.executor(settings.worker_threads, thread_name_prefix="tfship-predict", pinned=True)
    health = _Health([c.name for c in configs])
    manager = ModelManager(settings.backend, settings.runtime_options(), executor, runtime_wrapper(settings, metrics),
                           health.update, metrics)
    limits = ServerLimits(settings.max_batch_per_request, settings.max_concurrent_requests, settings.default_deadline_s,
                          settings.max_message_bytes, settings.max_request_memory_bytes)
    dataplane = DataPlane(manager, predict_executor, limits, metrics, RequestLog(settings.request_log_sampling_rate))
    dataplane.signature_method_name_check = settings.enable_signature_method_name_check
    dataplane.checks.lenient_fixed_dimensions = settings.lenient_fixed_dimensions
    health.names = manager.model_names
    dataplane.request_log.served = manager.is_configured  # names not served are logged as the metrics label them
    return _Core(manager, dataplane, health, (executor, predict_executor))


@dataclass
class _Ports:
    """The open transports: the gRPC server, the REST runner (on its own loop) and the metrics runner."""

    grpc: grpc.aio.Server
    rest_loop: TransportLoop | None
    rest: tuple | None  # (runner, port)
    metrics: tuple | None  # (runner, port)

    def closers(self) -> list:
        """Each HTTP runner's cleanup, as a coroutine on its own loop."""
        rest, rest_loop = self.rest, self.rest_loop
        return ([lambda: rest_loop.run(rest[0].cleanup())] if rest is not None and rest_loop is not None else []) + (
            [self.metrics[0].cleanup] if self.metrics else [])


def _grpc_server(settings: ServerSettings, core: _Core, policy: LivePolicy) -> grpc.aio.Server:
    """The gRPC server with both APIs' services (not bound yet); health's servicer joins `core.health`."""
    # message limits, port sharing and --grpc_channel_arguments (ServerSettings.grpc_options)
    server = grpc.aio.server(interceptors=[AccessInterceptor(policy), *tracing.grpc_interceptors()],
                             options=settings.grpc_options())
    core.health.servicer = add_services(server, core.dataplane, (add_inference_service(server, core.dataplane),),
                                        tensor_content=settings.enable_serialization_as_tensor_content)
    return server


async def _open_ports(settings: ServerSettings, server: grpc.aio.Server, core: _Core, policy: LivePolicy, live_tls,
                      ssl_ctx, metrics: Metrics, cores: CoreShare) -> _Ports:
    """Bind gRPC (and its Unix socket), start the shadows, then REST and metrics; write `--port-file`.

    Raises:
        ConfigError: a port cannot be bound, or a bad `--shadow`.
    """
    credentials = (grpc.alts_server_credentials() if settings.use_alts_credentials
                   else live_tls.grpc_credentials() if live_tls else None)
    grpc_port = _bind_grpc(server, settings, credentials)
    # workers share the port: one report folder
    core.dataplane.shadow = start_shadows(settings, core.manager, metrics, grpc_port)
    if settings.grpc_socket_path:  # TF Serving's Unix-socket listener beside TCP: same services and policy
        bind_unix_socket(server, settings.grpc_socket_path, credentials)
    await server.start()
    await core.health.overall()

    from tfship.serving.rest_port import start_metrics, start_rest

    # REST on its own loop and thread, gRPC and the data plane on this one: neither protocol starves the other
    cores.join()  # this thread serves gRPC; the REST thread joins it on the same core
    rest_loop = TransportLoop("tfship-rest", cores.join) if settings.rest_port >= 0 else None
    bridge = bridged(core.dataplane, asyncio.get_running_loop())
    rest = await _bind_http(rest_loop.run(start_rest(bridge, settings, policy, metrics, ssl_ctx))
                            if rest_loop else None, settings, "--rest-port", settings.rest_port)
    metrics_site = await _bind_http(start_metrics(metrics, settings, policy, ssl_ctx), settings, "--metrics-port",
                                    settings.metrics_port)
    ports = {"grpc": grpc_port, "rest": rest[1] if rest else None, "metrics": metrics_site[1] if metrics_site else None}
    if settings.port_file:  # written once every port is open and every model up (a `--num-processes` parent
        _write_port_file(settings.port_file, {**ports, "ready": True})  # waits for "ready")
    log.info("listening: %s%s", ports, f" and unix:{settings.grpc_socket_path}" if settings.grpc_socket_path else "")
    return _Ports(server, rest_loop, rest, metrics_site)


def _start_polls(settings: ServerSettings, manager: ModelManager, secrets: SecretWatcher, metrics: Metrics,
                 rest_loop: TransportLoop | None) -> tuple[list[asyncio.Task], Future | None]:
    """The background tasks of a running server: repository, config and secret polls, loop-lag watches.

    Returns:
        (tasks on this loop, the REST loop's lag watch as a concurrent future or None).
    """
    tasks = [asyncio.create_task(watch_lag(metrics.loop_lag.labels("grpc").observe))]
    if settings.file_system_poll_wait_seconds > 0:
        tasks.append(asyncio.create_task(manager.poll_forever(settings.file_system_poll_wait_seconds)))
    if settings.model_config_file and settings.model_config_file_poll_wait_seconds > 0:
        tasks.append(asyncio.create_task(poll_model_config_file(settings, manager)))
    if secrets.watching:
        tasks.append(asyncio.create_task(secrets.watch_forever()))
    rest_lag = (asyncio.run_coroutine_threadsafe(watch_lag(metrics.loop_lag.labels("rest").observe), rest_loop.loop)
                if rest_loop else None)
    return tasks, rest_lag


def _stop_event() -> asyncio.Event:
    """An event set by SIGTERM, SIGINT or SIGHUP (SIGHUP drains too: nothing to reload)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def run_server(settings: ServerSettings) -> int:
    """Serve until SIGTERM/SIGINT; return the exit code (0 after a clean drain)."""
    tracing.configure()  # OTEL_* variables (serving.operations.tracing): a bad value stops the start, named
    configs = model_configs(settings)
    check_config(configs)  # a missing base_path or version refuses to start, naming it (as TF Serving does)
    policy = LivePolicy(settings.access_policy())  # an empty token file refuses to start, naming it
    tls = tls_material(settings)
    ssl_ctx = ssl_context(tls)  # HTTPS on REST and metrics whenever gRPC uses TLS (same cert, same client CA)
    live_tls = LiveTls(tls, ssl_ctx) if tls else None
    warn_readable_secrets(settings)
    secrets = SecretWatcher(settings, policy, live_tls)  # token and TLS files re-read when they change
    metrics = Metrics()
    cores = CoreShare(settings.pin_transport_threads)  # the transport threads' core (serving.affinity)
    core = _build_core(settings, configs, metrics, cores)
    server = _grpc_server(settings, core, policy)
    stop = _stop_event()

    # TF Serving's order: load every configured model, then open the ports, so the first client to connect
    # finds each model AVAILABLE and health SERVING (a client polling the port never sees "loading")
    await core.manager.apply_config(configs)
    down = [name for name in core.manager.model_names() if not core.health.ok.get(name)]
    if down:  # TF Serving refuses to start when a configured model cannot be loaded
        log.error("no version of model(s) %s could be loaded; see the errors above; exiting", down)
        await _bounded(core.manager.unload_all(), UNLOAD_TIMEOUT_S, "unloading models")
        core.shutdown_executors()
        return 1
    ports = await _open_ports(settings, server, core, policy, live_tls, ssl_ctx, metrics, cores)
    polls, rest_lag = _start_polls(settings, core.manager, secrets, metrics, ports.rest_loop)
    await stop.wait()

    if rest_lag:
        rest_lag.cancel()
    await _stop(settings, core, ports, polls)
    return 0


async def _stop(settings: ServerSettings, core: _Core, ports: _Ports, polls: list[asyncio.Task]) -> None:
    """Drain, close the ports and unload, all within --grace-period-s; then end the shadows and tracing."""
    loop = asyncio.get_running_loop()
    # the whole shutdown fits in --grace-period-s: the drain, then unloading in what is kept for it
    end = loop.time() + settings.grace_period_s
    unload_s = min(UNLOAD_TIMEOUT_S, settings.grace_period_s / 4)
    await _drain(settings.grace_period_s - unload_s, core.health, core.dataplane, ports.grpc, ports.closers(), polls)
    if ports.rest_loop:
        ports.rest_loop.stop()
    await _bounded(core.manager.unload_all(), max(end - loop.time(), 0.05), "unloading models")
    core.dataplane.offloader.close()
    if core.dataplane.shadow is not None:
        core.dataplane.shadow.close()
    tracing.shutdown()  # the spans still buffered are exported
    core.shutdown_executors()
    log.info("stopped")


def serve_process(settings: ServerSettings) -> int:
    """Run the server in this process (`tfship serve`, a `--num-processes` worker) until it drained.

    Returns the exit code of a server that did not start (1: no model loaded). A server that drained ends the
    process at once with 0 (`os._exit` after flushing the logs): tearing down the interpreter, TensorFlow's
    runtime and threads still inside a model call took 8-10 s more under load, past the grace period.
    """
    code = asyncio.run(run_server(settings))
    if code == 0:
        remove_own_scratch()  # os._exit runs no atexit hook: the --ssl_config_file PEM copies go here
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return code


async def _drain(grace_s: float, health: _Health, dataplane: DataPlane, server: grpc.aio.Server, closers: list,
                 polls: list[asyncio.Task]) -> None:
    """SIGTERM/SIGINT/SIGHUP: answer every request that reached the server, within `grace_s` seconds in all.

    Health turns NOT_SERVING and new requests are answered UNAVAILABLE (HTTP 503) at once, so clients retry
    elsewhere, while the ports stay open; admitted requests finish; a short linger answers requests the
    transports had received but not yet dispatched; then the ports close, anything still running is cancelled
    when the grace period ends.
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + grace_s
    deadline = end - min(CLOSE_RESERVE_S, grace_s / 4)  # requests get this long; closing the ports the rest
    log.info("draining (grace %.1fs)", grace_s)
    dataplane.gate.close()
    health.draining = True
    for name in list(health.ok):
        await health.update(name, False)
    await health.overall()
    for task in polls:
        task.cancel()
    if not await dataplane.gate.wait_idle(deadline - loop.time()):
        log.warning("grace period over with %d request(s) still running; cancelling them", dataplane.gate.active)
    await asyncio.sleep(max(min(DRAIN_LINGER_S, deadline - loop.time()), 0))
    await dataplane.gate.wait_idle(deadline - loop.time())
    await server.stop(max(deadline - loop.time(), 0))
    for close in closers:  # each HTTP runner's cleanup, on its own loop
        await _bounded(close(), max(end - loop.time(), 0.05), "closing HTTP connections")


async def _bounded(awaitable, timeout_s: float, what: str) -> None:
    """Await `awaitable` for at most `timeout_s` seconds (shutdown never waits longer), logging a timeout."""
    try:
        async with asyncio.timeout(timeout_s):
            await awaitable
    except TimeoutError:
        log.warning("%s took longer than %.1fs; going on with the shutdown", what, timeout_s)

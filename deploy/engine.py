"""A small, typed layer over the Docker SDK for Python: build, run, wait healthy, stop.

Everything `tfship deploy` and the docker tests do with an engine goes through `Engine`; the
SDK's dicts and exceptions stay in here. Errors are `DeployError` (a `TfshipError`), each naming
what was asked for and what the engine answered, with the SDK's exception as the cause.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import docker
import docker.errors
from docker.models.containers import Container
from docker.types import DeviceRequest

from tfship.core.errors import FailedPreconditionError

REPO_ROOT = Path(__file__).resolve().parent.parent
OFFICIAL_BASE_IMAGE = "python:3.11-slim-bookworm"
LOCAL_BASE_IMAGE = "tfship/base:bookworm"
MODELS_MOUNT = "/models"


class DeployError(FailedPreconditionError):
    """The container engine refused or failed a build, run or stop (names the image or container)."""


class Target(enum.StrEnum):
    """Dockerfile targets: two server images and the training image (`tfship` as its entry point)."""

    CLOUD = "cloud"
    EDGE = "edge"
    TRAIN = "train"


@dataclass(frozen=True)
class BuildSpec:
    """One image build.

    Attributes:
        target: Dockerfile target.
        tag: image tag to write, e.g. `tfship:edge`.
        base_image: BASE_IMAGE build arg.
        context: build context (the repository root; `.dockerignore` keeps it small).
        platform: e.g. `linux/arm64`; None builds for the engine's own platform.
    """

    target: Target
    tag: str
    base_image: str
    context: Path = REPO_ROOT
    platform: str | None = None


@dataclass(frozen=True)
class BuildResult:
    """What a build produced."""

    tag: str
    image_id: str
    size_bytes: int
    seconds: float


@dataclass(frozen=True)
class Ports:
    """Ports the server listens on inside the container (and on the host with host networking)."""

    grpc: int = 8500
    rest: int = 8501
    metrics: int = 9090


@dataclass(frozen=True)
class RunSpec:
    """One server container.

    Attributes:
        image: image tag to run.
        name: container name (one container per name: an old one is removed first).
        repository: host folder holding `<model_name>/<version>/`, mounted read-only at /models.
        model_name: MODEL_NAME.
        ports: server ports.
        host_network: share the host's network (needed where the engine has no bridge);
            otherwise the ports are published on 127.0.0.1 under the same numbers.
        gpus: request every GPU (needs the NVIDIA container toolkit).
        env: extra environment variables.
        health_interval_s: probe the image's HEALTHCHECK this often instead of its own interval
            (tests use a short one to learn sooner that the server is up).
        health_timeout_s: give each probe this long instead of the image's 5 s (a probe is a Python start:
            under QEMU emulation it takes tens of seconds).
    """

    image: str
    name: str
    repository: Path
    model_name: str
    ports: Ports = Ports()
    host_network: bool = False
    gpus: bool = False
    env: dict[str, str] = field(default_factory=dict)
    health_interval_s: float | None = None
    health_timeout_s: float | None = None


@dataclass(frozen=True)
class Endpoint:
    """Where a healthy container answers, from the host."""

    grpc: str
    rest: str
    metrics: str


@dataclass(frozen=True)
class StopResult:
    """How a container ended."""

    name: str
    exit_code: int
    seconds: float
    log_tail: str


BuildEvent = Callable[[dict], None]


class Engine:
    """A connected Docker engine."""

    def __init__(self, client: docker.DockerClient) -> None:
        self._client = client

    @classmethod
    def connect(cls, timeout_s: int = 600) -> Engine:
        """Connect from the environment (DOCKER_HOST etc.); fail with a fix if none answers."""
        try:
            client = docker.from_env(version="auto", timeout=timeout_s)
            client.ping()
        except docker.errors.DockerException as err:
            raise DeployError(
                f"no Docker engine answers ({err}); start one (make docker-engine, or "
                "deploy/docker/ensure-dockerd.sh) or set DOCKER_HOST"
            ) from err
        return cls(client)

    def has_bridge(self) -> bool:
        """Whether the engine has its default bridge network (dockerd --bridge=none has not)."""
        return bool(self._client.networks.list(names=["bridge"]))

    def image_exists(self, ref: str) -> bool:
        try:
            self._client.images.get(ref)
        except docker.errors.ImageNotFound:
            return False
        return True

    def resolve_base_image(self, requested: str | None, platform: str | None = None) -> str:
        """The BASE_IMAGE to build on: the one asked for, else the official one, else the local stand-in.

        `None` means auto: use `python:3.11-slim-bookworm` when present (or pullable, for
        `platform`), otherwise `tfship/base:bookworm` (`-<arch>` for a foreign platform), made by
        deploy/docker/build-base-image.sh.
        """
        if requested:
            return requested
        if platform is None and self.image_exists(OFFICIAL_BASE_IMAGE):
            return OFFICIAL_BASE_IMAGE
        local = self._local_base_image(platform)
        try:
            self._client.images.pull(OFFICIAL_BASE_IMAGE, platform=platform)
            return OFFICIAL_BASE_IMAGE
        except docker.errors.APIError as pull_err:
            if self.image_exists(local):
                return local
            arch = f"ARCH={local.rsplit('-', 1)[1]} " if local != LOCAL_BASE_IMAGE else ""
            raise DeployError(
                f"cannot pull {OFFICIAL_BASE_IMAGE} ({pull_err.explanation}) and no {local} exists; "
                f"build it with {arch}deploy/docker/build-base-image.sh or pass --base-image"
            ) from pull_err

    def _local_base_image(self, platform: str | None) -> str:
        if platform is None:
            return LOCAL_BASE_IMAGE
        arch = platform.split("/")[1] if "/" in platform else platform
        engine_arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(self._client.info()["Architecture"])
        return LOCAL_BASE_IMAGE if arch == engine_arch else f"{LOCAL_BASE_IMAGE}-{arch}"

    def build(self, spec: BuildSpec, on_event: BuildEvent | None = None) -> BuildResult:
        """Build `spec.target` and tag it; `on_event` sees every decoded progress message."""
        started = time.monotonic()
        image_id = ""
        for event in self._build_stream(spec):
            if on_event is not None:
                on_event(event)
            if "error" in event:
                detail = event.get("errorDetail", {}).get("message") or event["error"]
                raise DeployError(f"building {spec.tag} (target {spec.target}) failed: {detail.strip()}")
            aux = event.get("aux")
            if isinstance(aux, dict) and "ID" in aux:
                image_id = aux["ID"]
        if not image_id:
            image_id = self._client.images.get(spec.tag).id or ""
        size = self._client.images.get(spec.tag).attrs["Size"]
        return BuildResult(tag=spec.tag, image_id=image_id, size_bytes=size, seconds=time.monotonic() - started)

    def _build_stream(self, spec: BuildSpec) -> Iterator[dict]:
        try:
            yield from self._client.api.build(
                path=str(spec.context),
                dockerfile="Dockerfile",
                target=spec.target.value,
                tag=spec.tag,
                buildargs={"BASE_IMAGE": spec.base_image},
                platform=spec.platform,
                network_mode="host",
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
            )
        except docker.errors.APIError as err:
            raise DeployError(f"building {spec.tag} (target {spec.target}): {err.explanation}") from err

    def image_platform(self, ref: str) -> str:
        """`os/architecture` an image was built for, e.g. `linux/arm64`."""
        try:
            attrs = self._client.images.get(ref).attrs
        except docker.errors.ImageNotFound as err:
            raise DeployError(f"no image {ref}; build it with `tfship deploy build`") from err
        return f"{attrs.get('Os', '?')}/{attrs.get('Architecture', '?')}"

    def image_size(self, ref: str) -> int:
        """Uncompressed size of an image in bytes."""
        try:
            return self._client.images.get(ref).attrs["Size"]
        except docker.errors.ImageNotFound as err:
            raise DeployError(f"no image {ref}; build it with `tfship deploy build`") from err

    def run(self, spec: RunSpec) -> Container:
        """Start a server container detached; an old container of the same name is removed first."""
        repository = spec.repository.resolve()
        if not (repository / spec.model_name).is_dir():
            raise DeployError(
                f"no model folder {repository / spec.model_name}: publish a model first (make pipeline)"
            )
        self.remove(spec.name)
        env = {
            "MODEL_NAME": spec.model_name,
            "MODEL_BASE_PATH": MODELS_MOUNT,
            "GRPC_PORT": str(spec.ports.grpc),
            "REST_PORT": str(spec.ports.rest),
            "METRICS_PORT": str(spec.ports.metrics),
            **spec.env,
        }
        options: dict = {
            "detach": True,
            "name": spec.name,
            "environment": env,
            "volumes": {str(repository): {"bind": MODELS_MOUNT, "mode": "ro"}},
            "labels": {"org.tfship.role": "server"},
        }
        if spec.host_network:
            options["network_mode"] = "host"
        else:
            options["ports"] = {
                f"{port}/tcp": ("127.0.0.1", port)
                for port in (spec.ports.grpc, spec.ports.rest, spec.ports.metrics)
            }
        timing = {key: int(value * 1e9) for key, value in (("interval", spec.health_interval_s),
                                                           ("timeout", spec.health_timeout_s)) if value}
        if timing:  # the engine keeps the image's probe command when only the timing is given
            options["healthcheck"] = timing
        if spec.gpus:
            options["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
        try:
            return self._client.containers.run(spec.image, **options)
        except docker.errors.ImageNotFound as err:
            raise DeployError(f"no image {spec.image}; build it with `tfship deploy build`") from err
        except docker.errors.APIError as err:
            raise DeployError(f"starting {spec.name} from {spec.image}: {err.explanation}") from err

    def run_once(self, image: str, command: list[str]) -> int:
        """Run `command` in a throwaway container of `image` (entrypoint replaced); its exit code."""
        try:
            container = self._client.containers.run(image, entrypoint=command, detach=True, network_mode="host")
        except docker.errors.APIError as err:
            raise DeployError(f"running {command[0]} in {image}: {err.explanation}") from err
        try:
            return int(container.wait(timeout=300)["StatusCode"])
        finally:
            container.remove(force=True)

    def wait_healthy(self, name: str, timeout_s: float) -> None:
        """Block until the container's HEALTHCHECK reports healthy, by following the engine's events.

        Raises DeployError when the container exits, turns unhealthy or the timeout passes;
        the message carries the last health probe output and log lines.
        """
        container = self._get(name)
        since = container.attrs["Created"]
        deadline = time.time() + timeout_s
        if self._health(container) == "healthy":
            return
        events = self._client.events(
            decode=True,
            since=_parse_ts(since),
            until=int(deadline) + 1,
            filters={"container": container.id, "type": "container"},
        )
        try:
            for event in events:
                action = event.get("Action", "")
                if action == "health_status: healthy":
                    return
                if action == "die" or action == "health_status: unhealthy":
                    raise DeployError(f"container {name} {action}; {self._diagnosis(name)}")
        finally:
            events.close()
        raise DeployError(f"container {name} not healthy after {timeout_s:.0f}s; {self._diagnosis(name)}")

    def stop(self, name: str, timeout_s: int = 30) -> StopResult:
        """SIGTERM the container, wait for it to exit (SIGKILL after `timeout_s`), report its exit code."""
        container = self._get(name)
        started = time.monotonic()
        try:
            container.stop(timeout=timeout_s)
            status = container.wait(timeout=timeout_s + 30)
        except docker.errors.APIError as err:
            raise DeployError(f"stopping {name}: {err.explanation}") from err
        log_tail = container.logs(tail=20).decode(errors="replace")
        return StopResult(name=name, exit_code=int(status["StatusCode"]),
                          seconds=time.monotonic() - started, log_tail=log_tail)

    def timeline(self, name: str) -> tuple[datetime, list[tuple[datetime, str]]]:
        """When the engine started the container, and its log lines with the engine's timestamp of each (UTC)."""
        container = self._get(name)
        container.reload()
        lines = []
        for raw in container.logs(timestamps=True).decode(errors="replace").splitlines():
            stamp, _, text = raw.partition(" ")
            lines.append((_parse_time(stamp), text))
        return _parse_time(container.attrs["State"]["StartedAt"]), lines

    def remove(self, name: str) -> None:
        """Remove a container by name, running or not; absent is fine."""
        try:
            self._client.containers.get(name).remove(force=True)
        except docker.errors.NotFound:
            return

    def endpoint(self, spec: RunSpec) -> Endpoint:
        host = "127.0.0.1"
        return Endpoint(
            grpc=f"{host}:{spec.ports.grpc}",
            rest=f"http://{host}:{spec.ports.rest}/v1/models/{spec.model_name}",
            metrics=f"http://{host}:{spec.ports.metrics}/metrics",
        )

    def _get(self, name: str) -> Container:
        try:
            return self._client.containers.get(name)
        except docker.errors.NotFound as err:
            raise DeployError(f"no container named {name}") from err

    @staticmethod
    def _health(container: Container) -> str:
        container.reload()
        return container.attrs["State"].get("Health", {}).get("Status", "none")

    def _diagnosis(self, name: str) -> str:
        container = self._get(name)
        container.reload()
        state = container.attrs["State"]
        probes = state.get("Health", {}).get("Log", [])
        last_probe = probes[-1]["Output"].strip() if probes else "no probe ran"
        logs = container.logs(tail=15).decode(errors="replace").strip()
        return (f"state={state['Status']} exit={state.get('ExitCode')} last probe: {last_probe}\n"
                f"--- last log lines ---\n{logs}")


def _parse_time(stamp: str) -> datetime:
    """Docker's RFC 3339 time with nanoseconds (`2026-12-03T06:52:43.123456789Z`) as an aware datetime (µs)."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{whole}.{(fraction or '0')[:6]:0<6}+00:00")


def _parse_ts(created: str) -> int:
    """Docker's RFC 3339 `Created` (nanoseconds, Z) as whole Unix seconds, one second early."""
    stamp = created.rstrip("Z").split(".")[0]
    return int(datetime.fromisoformat(stamp + "+00:00").timestamp()) - 1

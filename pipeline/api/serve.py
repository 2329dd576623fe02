"""`with tfship.serve(repository, "digits") as served:` a real model server for a test or a notebook.

The server is `python -m tfship.serving` in a child process on free loopback ports (`serving.launcher`),
ready (grpc.health.v1 SERVING) when the block starts and stopped (SIGTERM, drained) when it ends. It needs
no TensorFlow unless the `saved_model` backend is chosen, so it works in the TensorFlow-free base install.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tfship.core.errors import ConfigError
from tfship.core.locations import BucketUrl, parse_location
from tfship.pipeline.api.client import Client
from tfship.serving.launcher import ServerProcess

SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the repository root in a checkout


@dataclass(frozen=True)
class Served:
    """Where a running server answers: grpc `127.0.0.1:port`; rest and metrics `http://127.0.0.1:port` (None
    when off); the model it serves and from which repository.
    """

    grpc: str
    rest: str | None
    metrics: str | None
    model_name: str
    repository: Path | BucketUrl

    def client(self, protocol: str = "grpc", timeout_s: float = 30.0) -> Client:
        """A `Client` for this server's model over `grpc` or `rest`."""
        if protocol not in ("grpc", "rest"):
            raise ConfigError(f"protocol {protocol!r}: expected 'grpc' or 'rest'")
        target = self.grpc if protocol == "grpc" else self.rest
        if target is None:
            raise ConfigError("this server has no REST port (started with rest=False)")
        return Client(target, self.model_name, timeout_s=timeout_s)


def _only_model(repository: Path) -> str:
    names = sorted(p.name for p in repository.iterdir() if p.is_dir()) if repository.is_dir() else []
    if len(names) != 1:
        raise ConfigError(f"serve: give model_name; {repository} holds {names or 'no model folder'}")
    return names[0]


def _source(repository, model_name: str | None) -> tuple[Path | BucketUrl, str]:
    published = getattr(repository, "published", None)
    if published is not None or hasattr(repository, "status_line"):  # a ShipResult
        if published is None:
            raise ConfigError(f"serve: the run {repository.run} published nothing ({repository.status_line})")
        return Path(published).parent.parent, model_name or Path(published).parent.name
    repository = parse_location(repository, "repository")
    if isinstance(repository, BucketUrl):
        if not model_name:
            raise ConfigError(f"serve: name the model to serve from {repository} (model_name=...)")
        return repository, model_name
    return repository, model_name or _only_model(repository)


@contextmanager
def serve(repository, model_name: str | None = None, *, backend: str = "auto", rest: bool = True,
          metrics: bool = False, args: Sequence[str] = (), startup_timeout_s: float = 120.0) -> Iterator[Served]:
    """Serve a model from a repository for the duration of a `with` block.

    Args:
        repository: `<repository>/<model_name>/<version>/` folders, or a `ShipResult` (its published model).
        model_name: the model to serve (default: the repository's only model, or the result's).
        backend: `auto`, `saved_model`, `onnx` or `tflite`.
        rest, metrics: open the REST and the Prometheus port as well (gRPC is always on).
        args: more `tfship serve` flags, e.g. `("--enable-batching",)`.
        startup_timeout_s: seconds to wait for SERVING.

    Yields:
        `Served`: the targets (`served.grpc`, `served.rest`), and `served.client()`.

    Raises:
        ConfigError: no model to serve; ServerStartError: the server exited or was not SERVING in time (the
        message ends with its output).
    """
    repository, model_name = _source(repository, model_name)
    flags = [*(() if rest else ("--rest-port", "-1")), *(() if metrics else ("--metrics-port", "-1")), *args]
    source_tree = (SOURCE_ROOT / "pyproject.toml").is_file()  # a checkout, not an installed copy
    where = repository.resolve() if isinstance(repository, Path) else repository  # or a bucket URL
    with ServerProcess(where, model_name, backend=backend, extra_args=flags,
                       startup_timeout_s=startup_timeout_s, installed=not source_tree) as server:
        yield Served(server.grpc_target, server.rest_url, server.metrics_url, model_name, repository)

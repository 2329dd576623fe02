"""`tfship deploy build|run|stop --target cloud|edge`: the server images, driven through the Docker SDK.

`register(subparsers)` adds the `deploy` command to the main CLI; `python -m tfship.deploy ...`
runs the same commands on its own (the Makefile's docker targets use that). Importing this module
imports neither docker nor TensorFlow: the engine layer (`deploy.engine`) loads when a
command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tfship.core.errors import TfshipError, cli_error
from tfship.core.locations import cli_location

if TYPE_CHECKING:
    from tfship.deploy.engine import Engine, RunSpec

TARGETS = ("cloud", "edge")  # the server images (run, stop)
BUILD_TARGETS = (*TARGETS, "train")  # and the training image
DEFAULT_IMAGE = "tfship:{target}"
DEFAULT_CONTAINER = "tfship-{target}"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `deploy` with its `build`, `run` and `stop` subcommands; each sets `func(args) -> int`."""
    deploy = subparsers.add_parser("deploy", help="build, run and stop the server containers (Docker)",
                                   description=(__doc__ or "").split("\n\n")[0])
    actions = deploy.add_subparsers(dest="deploy_action", required=True, metavar="{build,run,stop}")

    build = actions.add_parser("build", help="build the cloud, edge or train image, streaming progress")
    _add_target(build, BUILD_TARGETS)
    build.add_argument("--base-image", default=None,
                       help="BASE_IMAGE build arg (default: python:3.11-slim-bookworm when present or "
                            "pullable, else tfship/base:bookworm)")
    build.add_argument("--platform", default=None, help="e.g. linux/arm64 (default: the engine's)")
    build.add_argument("--quiet", action="store_true", help="print step headers only, not every line")
    build.set_defaults(func=cmd_build)

    run = actions.add_parser("run", help="serve a model repository in a container; print the endpoint once healthy")
    _add_target(run)
    run.add_argument("--name", default=None, help="container name (default: tfship-<target>)")
    run.add_argument("--repository", type=cli_location, default=Path("models"),
                     help="host model repository, mounted read-only at /models (default: models)")
    run.add_argument("--model-name", default="digits", help="MODEL_NAME (default: digits)")
    run.add_argument("--grpc-port", type=int, default=8500)
    run.add_argument("--rest-port", type=int, default=8501)
    run.add_argument("--metrics-port", type=int, default=9090)
    run.add_argument("--network", choices=("auto", "host", "bridge"), default="auto",
                     help="host: share the host network; bridge: publish ports on 127.0.0.1; "
                          "auto: bridge when the engine has one (default)")
    run.add_argument("--backend", choices=("saved_model", "onnx", "tflite"), default=None,
                     help="MODEL_BACKEND: force one runtime (default: the server's choice)")
    run.add_argument("--artifact", default=None,
                     help="MODEL_ARTIFACT: serve this published artifact (e.g. tflite_int8) as the version's "
                          "manifest.json lists it")
    run.add_argument("--gpus", action="store_true", help="request all GPUs (NVIDIA container toolkit)")
    run.add_argument("--health-timeout", type=float, default=180.0,
                     help="seconds to wait for the HEALTHCHECK to report healthy (default 180)")
    run.set_defaults(func=cmd_run)

    stop = actions.add_parser("stop", help="SIGTERM the container, wait, report its exit code, remove it")
    _add_target(stop)
    stop.add_argument("--name", default=None, help="container name (default: tfship-<target>)")
    stop.add_argument("--timeout", type=int, default=30, help="seconds before SIGKILL (default 30)")
    stop.add_argument("--keep", action="store_true", help="keep the stopped container")
    stop.set_defaults(func=cmd_stop)
    return deploy


def _add_target(parser: argparse.ArgumentParser, targets: tuple[str, ...] = TARGETS) -> None:
    parser.add_argument("--target", choices=targets, required=True, help="Dockerfile target")
    parser.add_argument("--image", default=None, help="image tag (default: tfship:<target>)")


def _image(args: argparse.Namespace) -> str:
    return args.image or DEFAULT_IMAGE.format(target=args.target)


def _container(args: argparse.Namespace) -> str:
    return args.name or DEFAULT_CONTAINER.format(target=args.target)


def cmd_build(args: argparse.Namespace) -> int:
    """Build one target and print its tag and size."""
    from rich.console import Console

    from tfship.deploy.engine import BuildSpec, Engine, Target

    console = Console(stderr=True, highlight=False)
    engine = Engine.connect()
    base = engine.resolve_base_image(args.base_image, args.platform)
    spec = BuildSpec(target=Target(args.target), tag=_image(args), base_image=base, platform=args.platform)
    console.print(f"[bold]building[/] {spec.tag} (target {spec.target}, BASE_IMAGE={base})")
    with console.status(f"building {spec.tag}") as status:
        result = engine.build(spec, on_event=_BuildPrinter(console, status, quiet=args.quiet))
    console.print(f"[green]built[/] {result.tag} {result.image_id[:19]} "
                  f"{result.size_bytes / 1e6:.0f} MB in {result.seconds:.0f}s")
    print(f"{result.tag} {result.size_bytes}")
    return 0


class _BuildPrinter:
    """Turns the engine's build messages into rich output: step headers bold, the rest dim."""

    def __init__(self, console, status, quiet: bool) -> None:
        self._console = console
        self._status = status
        self._quiet = quiet

    def __call__(self, event: dict) -> None:
        text = event.get("stream") or event.get("status") or ""
        for line in text.rstrip("\n").splitlines():
            if line.startswith("Step "):
                self._status.update(line[:100])
                self._console.print(f"[bold cyan]{_escape(line)}[/]")
            elif line.strip() and not self._quiet:
                self._console.print(f"[dim]{_escape(line)}[/]")


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def run_spec(args: argparse.Namespace, engine: Engine) -> RunSpec:
    """The RunSpec for `deploy run` arguments (host networking where the engine has no bridge)."""
    from tfship.deploy.engine import Ports, RunSpec

    host_network = args.network == "host" or (args.network == "auto" and not engine.has_bridge())
    return RunSpec(
        image=_image(args),
        name=_container(args),
        repository=args.repository,
        model_name=args.model_name,
        ports=Ports(grpc=args.grpc_port, rest=args.rest_port, metrics=args.metrics_port),
        host_network=host_network,
        gpus=args.gpus,
        env={**({"MODEL_BACKEND": args.backend} if args.backend else {}),
             **({"MODEL_ARTIFACT": args.artifact} if args.artifact else {})},
    )


def cmd_run(args: argparse.Namespace) -> int:
    """Start the container, wait for health SERVING, print the endpoint."""
    from rich.console import Console

    from tfship.deploy.engine import Engine

    console = Console(stderr=True, highlight=False)
    engine = Engine.connect()
    spec = run_spec(args, engine)
    network = "host network" if spec.host_network else "ports published on 127.0.0.1"
    console.print(f"[bold]starting[/] {spec.name} from {spec.image} ({network}), "
                  f"model {spec.model_name} from {spec.repository.resolve()}")
    engine.run(spec)
    with console.status(f"waiting for {spec.name} to report healthy"):
        engine.wait_healthy(spec.name, args.health_timeout)
    endpoint = engine.endpoint(spec)
    console.print(f"[green]healthy[/] {spec.name}")
    print(f"grpc    {endpoint.grpc}\nrest    {endpoint.rest}\nmetrics {endpoint.metrics}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop the container; non-zero when it did not exit cleanly (exit code 0)."""
    from rich.console import Console

    from tfship.deploy.engine import Engine

    console = Console(stderr=True, highlight=False)
    engine = Engine.connect()
    name = _container(args)
    result = engine.stop(name, timeout_s=args.timeout)
    if not args.keep:
        engine.remove(name)
    if result.exit_code != 0:
        console.print(f"[red]{name} exited with code {result.exit_code}[/] after {result.seconds:.1f}s\n"
                      f"{_escape(result.log_tail)}")
        return 1
    console.print(f"[green]stopped[/] {name}: exit code 0 after {result.seconds:.1f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m tfship.deploy ...` (same as `tfship deploy ...`)."""
    parser = argparse.ArgumentParser(prog="tfship")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["deploy", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except TfshipError as err:
        line, code = cli_error("tfship deploy", err)
        print(line, file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())

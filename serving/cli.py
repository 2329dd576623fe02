"""`serve` and `query` subcommands, registered into the main CLI (`pipeline/cli/app.py`) or run standalone.

`serve` flags follow TF Serving's model server where one exists (`--port`, `--rest-port`,
`--model-config-file`, `--file-system-poll-wait-seconds`, `--batching-parameters-file`, ...).
"""

from __future__ import annotations

import argparse
import os
import sys

from tfship.core.errors import ConfigError, TfshipError, cli_error
from tfship.core.locations import cli_location, cli_path
from tfship.core.scratch import remove_orphaned_scratch
from tfship.serving.runtimes import backend_names  # the runtime registry (light: backends import lazily)
from tfship.serving.tfs.flags import add_tf_serving_flags, log_tf_serving_notes, settings_values

ENV_PREFIX = "TFSHIP_SERVING_"


def _env_defaults(parser: argparse.ArgumentParser, actions: list[argparse.Action]) -> None:
    """Let `TFSHIP_SERVING_<FLAG>` (e.g. TFSHIP_SERVING_REST_PORT=-1) replace a flag's default; flags still win.

    Raises `ConfigError` naming the variable when its value does not parse.
    """
    for action in actions:
        value = os.environ.get(ENV_PREFIX + action.dest.upper())
        if value is None:
            continue
        try:
            if action.nargs == 0:  # store_true flag
                parsed = value.strip().lower() in ("1", "true", "yes", "on")
            else:
                parsed = action.type(value) if callable(action.type) else value
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{ENV_PREFIX}{action.dest.upper()}={value!r}: {err}") from err
        if action.choices and parsed not in action.choices:
            raise ConfigError(f"{ENV_PREFIX}{action.dest.upper()}={value!r}: choose from {list(action.choices)}")
        parser.set_defaults(**{action.dest: parsed})


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every `serve` flag to `parser` (names map 1:1 onto `ServerSettings` fields).

    Each default can be overridden by the environment variable `TFSHIP_SERVING_<FLAG_NAME>`.
    """
    actions: list[argparse.Action] = []

    def a(*flags, **options) -> None:
        actions.append(parser.add_argument(*flags, **options))

    for group in (_model_flags, _port_flags, _security_flags, _operation_flags, _shadow_flags):
        group(a)
    _env_defaults(parser, actions)
    add_tf_serving_flags(parser)  # TF Serving's spellings (--model_name, --rest_api_port, ...); the rest refused


def _model_flags(a) -> None:
    """`serve` flags: the models and how they are served; `a` adds one (argparse's add_argument)."""
    a("--repository", type=cli_location, help="model repository: <repository>/<model_name>/<version>/")
    a("--model-name", help="model to serve from --repository")
    a("--model-config-file", type=cli_location, help="TF Serving ModelServerConfig (text format): a file or "
      "s3://BUCKET/KEY")
    a("--backend", choices=backend_names(), default="auto", help="runtime backend (default: auto)")
    a("--tflite-file", default="model.tflite", help="TFLite artifact for the tflite backend")
    a("--artifact", help="serve this published artifact of each version (e.g. tflite_int8, onnx): the backend and "
      "file its manifest.json lists; refused where the gate did not publish it")
    a("--allow-ops", type=_op_names, default=(), help="comma-separated op names a SavedModel may hold although they "
      "touch the host (e.g. PrintV2), and TFLite custom ops a .tflite file may use; default: a version holding any "
      "is refused at load (docs/security.md)")
    a("--verify-key", type=cli_path, help="PEM EC public key: serve only versions signed by it for their model name "
      "and version (tfship publish with publish.signing_key); unsigned, tampered or substituted versions are refused "
      "at load (docs/security.md, Signed versions)")

def _op_names(value: str) -> tuple[str, ...]:
    """`--allow-ops` as op names (argparse type; a ValueError is its usage error)."""
    from tfship.core.op_policy import parse_op_list

    return parse_op_list(value)


def _port_flags(a) -> None:
    """`serve` flags: ports, polls, threads and limits; `a` adds one (argparse's add_argument)."""
    a("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    a("--port", type=int, default=8500, help="gRPC port; 0 = any free port (default: 8500)")
    a("--rest-port", type=int, default=8501, help="REST port; 0 = any free, -1 = off (default: 8501)")
    a("--metrics-port", type=int, default=-1, help="Prometheus port; 0 = any free, -1 = off (default)")
    a("--port-file", type=cli_path, help="write the bound ports as JSON here once listening")
    a("--file-system-poll-wait-seconds", type=float, default=1.0, help="repository poll interval; 0 = off")
    a("--intra-op-threads", type=int, default=0, help="threads inside one op (0: backend default)")
    a("--inter-op-threads", type=int, default=0, help="threads across ops (0: backend default)")
    a("--worker-threads", type=int, default=16, help="threads running backend calls")
    a("--enable-batching", action="store_true", help="merge concurrent requests into one backend call")
    a("--batching-parameters-file", type=cli_path, help="TF Serving BatchingParameters text file (implies batching)")
    a("--batch-thread-nice", type=int, default=0,
      help="nice value 0..19 of the batch threads (default 0: unchanged). On a core the batch threads share with "
           "the transport (a server pinned to one CPU), the event loop then decodes the requests that arrive "
           "while a batch runs, and batches fill (heavy MLP, c=32: 3 -> 16 rows per call at 5); under a load "
           "beyond the model's capacity a higher value leaves the model less of that core")
    a("--max-message-bytes", type=int, default=64 << 20, help="largest request/response, bytes")
    a("--max-batch-per-request", type=int, default=1024,
      help="largest batch (dim 0) per request; 0 = unlimited (default: 1024)")
    a("--max-request-memory-bytes", type=int, default=256 << 20,
      help="largest inputs + outputs one request may hold, bytes; 0 = unlimited (default: 256 MiB)")
    a("--max-concurrent-requests", type=int, default=0, help="Predicts served at once; 0 = unlimited")
    a("--default-deadline-s", type=float, default=0.0, help="deadline when the client sets none; 0 = none")
    a("--rest-api-timeout-in-ms", type=int, default=30000,
      help="REST: headers and body must arrive within this time; idle connections close after it (TF Serving's "
           "--rest_api_timeout_in_ms; default 30000)")
    a("--grace-period-s", type=float, default=10.0, help="SIGTERM: seconds in-flight requests get to finish")

def _security_flags(a) -> None:
    """`serve` flags: TLS and tokens; `a` adds one (argparse's add_argument)."""
    a("--tls-cert", type=cli_path, help="server certificate (PEM); enables TLS")
    a("--tls-key", type=cli_path, help="server private key (PEM)")
    a("--tls-client-ca", type=cli_path, help="client CA (PEM); enables mutual TLS")
    a("--auth-token-file", type=cli_path,
      help="inference bearer tokens: one per line, '#' comment lines and blank lines ignored; empty refused")
    a("--auth-token-env", help="env var with inference bearer tokens, comma-separated")
    a("--admin-token-file", type=cli_path, help="admin tokens (HandleReloadConfigRequest), same format; "
                                            "admin calls are off without them")
    a("--admin-token-env", help="env var with admin tokens, comma-separated")
    a("--enable-admin-api", action="store_true",
      help="allow admin calls on a server without tokens (trusted network only)")

def _operation_flags(a) -> None:
    """`serve` flags: logs, leniency, request log, threads and processes; `a` adds one (add_argument)."""
    a("--json-logs", action="store_true", help="log one JSON object per line")
    a("--lenient-fixed-dimensions", action="store_true",
      help="feed the model an input sent at its declared rank whose size contradicts a fixed dimension (a "
           "[-1,20] input sent as [B,30]), as TF Serving does; default: INVALID_ARGUMENT naming the declared shape")
    a("--request-log-sampling-rate", type=float, default=0.0,
      help="log one structured line (model, version, signature, method, status, latency, batch rows, peer) for "
           "this fraction of requests; 0 = off (default), 1 = every request")
    a("--spread-transport-threads", dest="pin_transport_threads", action="store_false",
      help="let the OS run the gRPC and REST threads on any core (default: both share one core, which keeps "
           "the GIL's handovers on it; see docs/serving.md)")
    a("--num-processes", type=count_or_auto, default=1,
      help="server processes sharing the gRPC/REST ports via SO_REUSEPORT (use the host's cores), or 'auto': one "
           "per CPU of this process' CPU set (os.sched_getaffinity); backend threads left at 0 are split between "
           "them; default 1")
    a("--reuse-port", action="store_true", help="bind the REST port with SO_REUSEPORT (set for each worker)")

def count_or_auto(value: str) -> int:
    """`--num-processes`: a count, or `auto`: the CPUs of this process' CPU set (`os.sched_getaffinity`; the
    machine's CPU count where it is missing), at least 1.

    Raises:
        ValueError: neither an integer nor `auto` (argparse names the flag and the value).
    """
    if value.strip().lower() == "auto":
        from tfship.serving.affinity import process_cpus

        return max(len(process_cpus() or ()) or os.cpu_count() or 1, 1)
    return int(value)


def _shadow_flags(a) -> None:
    """`serve` flags: shadow traffic (`serving.dataplane.shadow`); `a` adds one (argparse's add_argument)."""
    a("--shadow", action="append", default=[], metavar="MODEL=TARGET",
      help="also run a sampled share of MODEL's Predicts on TARGET (a version or a label such as canary) and "
           "report how the answers agree (repeatable; docs/serving.md, Shadow a candidate)")
    a("--shadow-rate", type=float, default=0.1, help="share of requests shadowed, 0..1 (default 0.1)")
    a("--shadow-queue-size", type=int, default=64, help="shadow pairs waiting at most; more are dropped, counted")
    a("--shadow-queue-bytes", type=int, default=256 << 20, help="bytes of request and answer arrays the shadow "
      "queue holds at most (default 256 MiB); more are dropped, counted")
    a("--shadow-workers", type=int, default=1, help="shadow calls at once, on their own threads (default 1)")
    a("--shadow-timeout-s", type=float, default=10.0, help="a shadow call's limit, seconds; the primary's deadline "
      "ends it sooner (default 10)")
    a("--shadow-keep-inputs", action="store_true", help="keep request inputs in the worst-disagreement sample")
    a("--shadow-atol", type=float, default=1e-5, help="value bound: atol * max(1, max|primary|) (default 1e-5)")
    a("--shadow-rtol", type=float, default=1e-5, help="value bound: + rtol * |primary| (default 1e-5)")
    a("--shadow-report-dir", type=cli_path, help="folder each process writes its shadow report part to "
      "(default: <temp>/tfship-shadow/<grpc port>, removed at stop)")


def add_query_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `query` flags to `parser`."""
    a = parser.add_argument
    a("--target", default="127.0.0.1:8500", help="gRPC target host:port")
    a("--model-name", default="digits")
    a("--signature-name", default="serving_default")
    a("--version", type=int)
    a("--count", type=int, default=20, help="held-out digits to send (default: 20)")
    a("--config", type=cli_path, help="pipeline TOML (tfship query: locates the held-out split)")
    a("--samples", type=cli_path, help=".npz with the inputs and labels to send: 'image' and 'label', one array "
      "per input name and 'y', or a golden set (default under tfship: the run's or the config's held-out rows)")
    a("--run", type=cli_path, help="tfship query: send this run's held-out rows with their named inputs (a run "
      "folder, a run id under run.runs_dir, or 'latest')")
    a("--task", default="auto", choices=["auto", "classification", "binary", "regression"],
      help="the metric reported (accuracy, AUC, MAE); auto: from the labels and outputs")
    a("--timeout-s", type=float, default=30.0)


def run_serve(args: argparse.Namespace) -> int:
    """Run the server until SIGTERM; returns the exit code. Raises `TfshipError` on bad settings."""
    from tfship.serving.operations import logs
    from tfship.serving.server import serve_process

    settings = settings_from_args(args)
    logs.configure(settings.json_logs)
    check_artifact(settings)
    remove_orphaned_scratch()  # temp folders of tfship processes killed with SIGKILL (core.scratch)
    log_tf_serving_notes(settings.tf_serving_notes)
    if settings.num_processes > 1:
        from tfship.serving.workers import run_workers

        return run_workers(settings)
    return serve_process(settings)


def settings_from_args(args: argparse.Namespace):
    """`ServerSettings` from parsed `serve` flags; raises `ConfigError` naming each bad flag and its value."""
    from pydantic import ValidationError

    from tfship.serving.settings import ServerSettings

    values = settings_values(args, ServerSettings.model_fields)
    try:
        return ServerSettings(**values)
    except ValidationError as err:
        problems = []
        for item in err.errors():
            field = str(item["loc"][0]) if item["loc"] else "?"
            problems.append(f"--{field.replace('_', '-')} {values.get(field)!r}: {item['msg']}")
        raise ConfigError("invalid serve flag(s): " + "; ".join(problems)) from err


def check_artifact(settings) -> None:
    """With `--artifact`: refuse conflicting file flags, and an artifact the newest local version (the one the
    default version policy serves) does not publish, before anything loads. Versions that appear later, or
    come from a bucket or a model config, are checked as each loads (`RuntimeRegistry.create`).

    Raises:
        ConfigError: naming the flag, the artifact, the manifest and what it lists as published.
    """
    if settings.artifact is None:
        return
    from pathlib import Path

    from tfship.serving.runtimes import REGISTRY
    from tfship.serving.runtimes.published import check_artifact_flags

    check_artifact_flags(settings.artifact, settings.tflite_file, settings.prefer_tflite_model)
    base = settings.model_base_path or (settings.repository / settings.model_name
                                        if settings.repository is not None and settings.model_name else None)
    if not isinstance(base, Path) or settings.model_config_file is not None or not base.is_dir():
        return
    versions = [p for p in base.iterdir() if p.is_dir() and p.name.isascii() and p.name.isdigit()]
    if versions:
        REGISTRY.resolve_artifact(settings.backend, max(versions, key=lambda p: int(p.name)), settings.artifact)


def run_query(args: argparse.Namespace) -> int:
    """Send labelled rows (named inputs) to a running server; print predicted vs true labels and the task's
    metric (no TensorFlow).

    The rows come from `--samples`, else from the loader the embedding CLI registered (`tfship query`: the
    held-out rows of `--run`, or of `--config`'s data).

    Raises:
        ConfigError: neither `--samples` nor a registered loader, or rows no output of the model fits.
    """
    from tfship.serving.query import query_rows, samples_from_file

    if args.samples is not None:
        inputs, labels = samples_from_file(args.samples, args.count)
    elif getattr(args, "held_out", None) is not None:
        inputs, labels = args.held_out(args.count, args.config, getattr(args, "run", None), args.model_name)
    else:
        raise ConfigError("query: give --samples FILE.npz (inputs and labels); `tfship query` sends the run's or "
                          "the config's held-out rows instead")
    query_rows(args.target, args.model_name, inputs, labels, task=args.task, signature_name=args.signature_name,
               version=args.version, timeout_s=args.timeout_s)
    return 0


def register(subparsers, held_out=None) -> None:
    """Add `serve` and `query` to an argparse subparsers object; each sets `func(args) -> exit code`.

    Args:
        subparsers: from `ArgumentParser.add_subparsers`.
        held_out: `(count, config_path, run, model_name) -> (named inputs, labels)`, the rows `query` sends
            without `--samples`, the served model's own (`model_name` is `--model-name`; the pipeline CLI passes
            `pipeline.orchestration.held_out.held_out_rows`; serving itself knows no data set).
    """
    serve = subparsers.add_parser("serve", help="serve models over TF Serving's gRPC and REST APIs")
    add_serve_arguments(serve)
    serve.set_defaults(func=run_serve)
    query = subparsers.add_parser("query", help="send held-out rows to a server and report the task's metric")
    add_query_arguments(query)
    query.set_defaults(func=run_query, held_out=held_out)


def main(argv: list[str] | None = None) -> int:
    """`python -m tfship.serving [serve|query] ...`; with no subcommand, `serve` is assumed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("serve", "query", "-h", "--help"):
        argv.insert(0, "serve")
    parser = argparse.ArgumentParser(prog="python -m tfship.serving")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except TfshipError as err:
        line, code = cli_error(f"{parser.prog} {args.command}", err)
        print(line, file=sys.stderr)
        return code


def tensorflow_model_server(argv: list[str] | None = None) -> int:
    """`tensorflow_model_server` console script: a TF Serving command line run unchanged by tfship.

    TF Serving's defaults apply where they differ from `tfship serve`: no REST server unless
    `--rest_api_port` is given. The bind address stays tfship's (127.0.0.1, or TFSHIP_SERVING_HOST /
    `--host`; TF Serving binds every interface).
    """
    return main(tensorflow_model_server_argv(list(sys.argv[1:] if argv is None else argv)))


def tensorflow_model_server_argv(argv: list[str]) -> list[str]:
    """`python -m tfship.serving` arguments for a `tensorflow_model_server` command line (REST off unless asked)."""
    if argv[:1] in (["-h"], ["--help"]):
        return ["serve", *argv]
    return ["serve", "--rest-port", "-1", *argv]

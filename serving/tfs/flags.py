"""TF Serving's `tensorflow_model_server` command line, accepted beside tfship's own `serve` flags.

Every flag of TF Serving's main.cc is accepted (both `--flag=value` and `--flag value`; booleans also bare,
`--flag`, as TensorFlow's flag parser takes them). Three kinds:

* aliases of tfship flags (`--model_name` = `--model-name`, `--tensorflow_intra_op_parallelism` =
  `--intra-op-threads`, ...) and TF Serving flags tfship implements with TF Serving's meaning
  (`ACTING`: `--grpc_socket_path`, `--grpc_channel_arguments`, `--prefer_tflite_model`,
  `--enable_serialization_as_tensor_content`, `--enable_signature_method_name_check`, ...);
* `NO_OP`: flags that only tune machinery tfship does not have (TensorFlow's C++ thread pools, load thread
  pools, TPU set-up): accepted, their value type-checked, logged at start-up with the reason, and answers
  are the same whatever they say;
* `WARNED`: two flags whose machinery tfship does not have but whose absence a caller could notice
  (`--enable_profiler`: no profiler service; `--mixed_precision`: models run at their exported precision):
  accepted, with a start-up warning saying so.

Semantics kept from TF Serving: `--rest_api_port=0` means REST off, `--model_base_path` is the model's own
folder (holding the version folders), `--ssl_config_file` is an `SSLConfig` text proto holding PEM
*contents* and `--monitoring_config_file` a `MonitoringConfig` text proto
(`prometheus_config { enable: true path: "..." }`). docs/tf-serving.md lists every flag.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from tfship.core.errors import ConfigError
from tfship.core.locations import cli_location, cli_path
from tfship.core.scratch import make_scratch

PROMETHEUS_PATH = "/monitoring/prometheus/metrics"
INT32_MAX = (1 << 31) - 1

Converter = Callable[[str], Any]  # a flag's value type: the text -> the value (argparse's `type`)
# TF Serving flag -> (tfship dest, value type) for flags with the same meaning under another name.
ALIASES: dict[str, tuple[str, Converter]] = {
    "model_name": ("model_name", str),
    "model_config_file": ("model_config_file", cli_location),  # a file, or an s3:// object
    "batching_parameters_file": ("batching_parameters_file", cli_path),
    "file_system_poll_wait_seconds": ("file_system_poll_wait_seconds", float),
    "tensorflow_intra_op_parallelism": ("intra_op_threads", int),
    "tensorflow_inter_op_parallelism": ("inter_op_threads", int),
    "rest_api_timeout_in_ms": ("rest_api_timeout_in_ms", int),
}


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def channel_arguments(text: str) -> tuple[tuple[str, int | str], ...]:
    """`--grpc_channel_arguments` (`key=value,key=value`) as gRPC server options, in order.

    As TF Serving: a value that parses as a 32-bit integer is passed as an int, anything else as a string;
    empty items are skipped. A later occurrence of a key wins (`ServerSettings.grpc_options`).

    Raises:
        argparse.ArgumentTypeError: an item without `=` or with an empty key (TF Serving has no answer for
            these: its parser indexes past the end).
    """
    out = []
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"item {item!r} of {text!r} is not key=value (e.g. "
                                             "grpc.max_connection_age_ms=30000,grpc.max_concurrent_streams=100)")
        key, value = key.strip(), value.strip()
        try:
            number = int(value)
        except ValueError:
            out.append((key, value))
            continue
        out.append((key, number) if -INT32_MAX - 1 <= number <= INT32_MAX else (key, value))
    return tuple(out)


def _tags(text: str) -> tuple[str, ...]:
    tags = tuple(sorted({t.strip() for t in text.split(",") if t.strip()}))
    if not tags:
        raise argparse.ArgumentTypeError(f"expected comma-separated tags (e.g. serve or serve,gpu), got {text!r}")
    return tags


# TF Serving flags tfship implements with TF Serving's meaning: flag -> (ServerSettings field, type, is_bool).
ACTING: dict[str, tuple[str, Converter, bool]] = {
    "grpc_socket_path": ("grpc_socket_path", str, False),
    "grpc_channel_arguments": ("grpc_channel_arguments", channel_arguments, False),
    "prefer_tflite_model": ("prefer_tflite_model", _bool, True),
    "enable_serialization_as_tensor_content": ("enable_serialization_as_tensor_content", _bool, True),
    "enable_signature_method_name_check": ("enable_signature_method_name_check", _bool, True),
    "per_process_gpu_memory_fraction": ("per_process_gpu_memory_fraction", float, False),
    "saved_model_tags": ("saved_model_tags", _tags, False),
    "enable_model_warmup": ("enable_model_warmup", _bool, True),
    "num_request_iterations_for_warmup": ("num_request_iterations_for_warmup", int, False),
    "use_alts_credentials": ("use_alts_credentials", _bool, True),
    "rest_api_enable_cors_support": ("rest_api_enable_cors_support", _bool, True),
}
# TF Serving flags that tune machinery tfship does not have: flag -> (value type, why the answers are the same).
NO_OP: dict[str, tuple[Converter, str]] = {
    "rest_api_num_threads": (int, "REST runs on the event loop; backend calls use --worker-threads"),
    "allow_version_labels_for_unavailable_models": (_bool, "labels are checked against the versions on disk"),
    "enable_per_model_batching_parameters": (_bool, "one --batching_parameters_file applies to every model"),
    "num_load_threads": (int, "versions load one at a time"),
    "num_unload_threads": (int, "versions unload one at a time"),
    "max_num_load_retries": (int, "a failed version is retried on the next repository poll"),
    "load_retry_interval_micros": (int, "a failed version is retried on the next repository poll"),
    "flush_filesystem_caches": (_bool, "no filesystem caches are held"),
    "tensorflow_session_parallelism": (int, "size TensorFlow's pools with --tensorflow_intra/inter_op_parallelism"),
    "tensorflow_session_config_file": (str, "TensorFlow runs with its default session options"),
    "platform_config_file": (str, "the runtime is chosen per version folder (--backend, --prefer_tflite_model)"),
    "grpc_max_threads": (int, "gRPC runs on asyncio; backend calls use --worker-threads"),
    "remove_unused_fields_from_bundle_metagraph": (_bool, "the MetaGraph is not kept in memory"),
    "num_tflite_pools": (int, "one LiteRT interpreter per version"),
    "num_tflite_interpreters_per_pool": (int, "one LiteRT interpreter per version"),
    "xla_cpu_compilation_enabled": (_bool, "TensorFlow compiles what the model asks to compile"),
    "xla_gpu_compilation_enabled": (_bool, "TensorFlow compiles what the model asks to compile"),
    "thread_pool_factory_config_file": (str, "backend calls use --worker-threads"),
    "skip_initialize_tpu": (_bool, "no TPU support"),
    "enable_grpc_healthcheck_service": (_bool, "grpc.health.v1 is always served"),
}
# Accepted with a start-up warning: the feature is absent and a caller could notice.
WARNED: dict[str, tuple[Converter, str]] = {
    "enable_profiler": (_bool, "tfship serves no TensorFlow profiler service (calls to it answer UNIMPLEMENTED); "
                               "profile with `make bench-serve BENCH_PROFILE_S=...`"),
    "mixed_precision": (str, "models run at the precision they were exported in"),
}
NOTES_DEST = "tf_serving_noted"  # raw (flag, value) pairs; settings_values makes the notes
VERSION_DEST = "tf_serving_version"
# Dests the aliases add beside ServerSettings' own fields; `settings_values` folds them in.
EXTRA_DESTS = ("model_base_path", "ssl_config_file", "monitoring_config_file")


def _rest_api_port(value: str) -> int:
    port = int(value)
    return -1 if port == 0 else port  # TF Serving: 0 = no REST server


class _Note(argparse.Action):
    """Records a NO_OP / WARNED flag with its (type-checked) value; `settings_values` turns it into a note."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        notes = list(getattr(namespace, NOTES_DEST, None) or [])
        assert option_string is not None  # an optional flag (--name), never positional
        notes.append((option_string.lstrip("-"), values))
        setattr(namespace, NOTES_DEST, notes)


def add_tf_serving_flags(parser: argparse.ArgumentParser) -> None:
    """Add TF Serving's spellings to a `serve` parser (their defaults never override tfship's)."""
    a = parser.add_argument
    keep = argparse.SUPPRESS
    for name, (dest, kind) in ALIASES.items():
        a(f"--{name}", dest=dest, type=kind, default=keep, help=f"TF Serving spelling of --{dest.replace('_', '-')}")
    a("--rest_api_port", dest="rest_port", type=_rest_api_port, default=keep,
      help="TF Serving spelling of --rest-port (0 = REST off, as in TF Serving)")
    a("--enable_batching", dest="enable_batching", type=_bool, nargs="?", const=True, default=keep,
      help="TF Serving spelling of --enable-batching (optional =true|false)")
    a("--model_base_path", "--model-base-path", dest="model_base_path", type=cli_location, default=keep,
      help="the model's folder holding its version folders (TF Serving); with --model_name (default 'default')")
    a("--model_config_file_poll_wait_seconds", "--model-config-file-poll-wait-seconds",
      dest="model_config_file_poll_wait_seconds", type=float, default=keep,
      help="re-read --model-config-file every N seconds and apply changes; 0 = never (default)")
    a("--ssl_config_file", "--ssl-config-file", dest="ssl_config_file", type=cli_path, default=keep,
      help="TF Serving SSLConfig text proto (server_key, server_cert, custom_ca, client_verify)")
    a("--monitoring_config_file", "--monitoring-config-file", dest="monitoring_config_file", type=cli_path,
      default=keep, help="TF Serving MonitoringConfig text proto (prometheus_config { enable path })")
    for name, (dest, kind, is_bool) in ACTING.items():
        options = {"nargs": "?", "const": True} if is_bool else {}
        a(f"--{name}", dest=dest, type=kind, default=keep, help=f"TF Serving's --{name} (docs/tf-serving.md)",
          **options)
    for name, (kind, _why) in {**NO_OP, **WARNED}.items():
        options = {"nargs": "?", "const": True} if kind is _bool else {}
        a(f"--{name}", action=_Note, type=kind, dest=NOTES_DEST, default=keep, help=argparse.SUPPRESS, **options)
    a("--version", dest=VERSION_DEST, type=_bool, nargs="?", const=True, default=keep,
      help="print the version and exit (TF Serving's --version)")


def log_tf_serving_notes(notes) -> None:
    """Log each accepted-without-effect TF Serving flag (`ServerSettings.tf_serving_notes`) with its reason."""
    import logging

    log = logging.getLogger("tfship.serving.tfs.flags")
    for name, value, reason, warn in notes:
        if warn:
            log.warning("--%s=%s accepted, but: %s", name, value, reason)
        else:
            log.info("--%s=%s accepted, no effect in tfship: %s", name, value, reason)


def version_text() -> str:
    """What `--version` prints: tfship's and the TensorFlow Serving API's versions (TF Serving's two lines)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    return (f"TensorFlow ModelServer: tfship {of('tfship')} (tensorflow-serving-api {of('tensorflow-serving-api')})\n"
            f"TensorFlow Library: {of('tensorflow')}")


@functools.cache
def _message_classes() -> dict[str, type]:
    """SSLConfig and MonitoringConfig, field numbers as in tensorflow_serving/config/*.proto."""
    T = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="tfship_tf_serving_config.proto", package="tensorflow.serving",
                                            syntax="proto3")

    def message(name: str, fields: list[tuple[str, int, int, str]]) -> None:
        proto = fd.message_type.add(name=name)
        for field_name, number, kind, type_name in fields:
            field = proto.field.add(name=field_name, number=number, type=kind, label=T.LABEL_OPTIONAL)
            if type_name:
                field.type_name = type_name

    message("SSLConfig", [("server_key", 1, T.TYPE_STRING, ""), ("server_cert", 2, T.TYPE_STRING, ""),
                          ("custom_ca", 3, T.TYPE_STRING, ""), ("client_verify", 4, T.TYPE_BOOL, "")])
    message("PrometheusConfig", [("enable", 1, T.TYPE_BOOL, ""), ("path", 2, T.TYPE_STRING, "")])
    message("MonitoringConfig", [("prometheus_config", 1, T.TYPE_MESSAGE, ".tensorflow.serving.PrometheusConfig")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.serving.{name}"))
            for name in ("SSLConfig", "MonitoringConfig")}


def _parse_text(path: Path, flag: str, type_name: str):
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read {flag} {path}: {err}") from err
    try:
        return text_format.Parse(text, _message_classes()[type_name]())
    except text_format.ParseError as err:
        raise ConfigError(f"{flag} {path}: not a {type_name} text proto: {err}") from err


def monitoring_settings(path: Path) -> dict:
    """`{"prometheus_path": ...}` from a MonitoringConfig file: the path when enabled (default TF Serving's
    `/monitoring/prometheus/metrics`), None (no metrics on the REST port) when not. Raises `ConfigError`.
    """
    config = _parse_text(path, "--monitoring_config_file", "MonitoringConfig").prometheus_config
    if not config.enable:
        return {"prometheus_path": None}
    route = config.path or PROMETHEUS_PATH
    if not route.startswith("/") or any(c in route for c in " ?#{}"):
        raise ConfigError(f"--monitoring_config_file {path}: prometheus_config.path {route!r} must be a URL path "
                          "starting with '/'")
    if route.rstrip("/") in ("/v1", "/v2") or route.startswith(("/v1/", "/v2/")):
        raise ConfigError(f"--monitoring_config_file {path}: prometheus_config.path {route!r} lies under the "
                          "API's /v1/ or /v2/ routes and would shadow them; choose another path")
    return {"prometheus_path": route}


def ssl_settings(path: Path) -> dict:
    """`tls_cert`/`tls_key`/`tls_client_ca` files written (0600, in a private folder removed at exit) from an
    SSLConfig file's PEM contents. `client_verify: true` needs `custom_ca`; a `custom_ca` without
    `client_verify` is refused (tfship requires client certificates whenever it is given a client CA).
    Raises `ConfigError` naming the file and field.
    """
    config = _parse_text(path, "--ssl_config_file", "SSLConfig")
    missing = [f for f in ("server_key", "server_cert") if not getattr(config, f).strip()]
    if missing:
        raise ConfigError(f"--ssl_config_file {path}: {' and '.join(missing)} must hold PEM text")
    if config.client_verify and not config.custom_ca.strip():
        raise ConfigError(f"--ssl_config_file {path}: client_verify: true needs custom_ca (the client CA PEM)")
    if config.custom_ca.strip() and not config.client_verify:
        raise ConfigError(f"--ssl_config_file {path}: custom_ca without client_verify: true would accept clients "
                          "without certificates; set client_verify: true (mutual TLS) or drop custom_ca")
    folder = make_scratch("ssl")  # 0700, removed at exit, also after a drain's os._exit (core.scratch)
    files = {"tls_cert": config.server_cert, "tls_key": config.server_key, "tls_client_ca": config.custom_ca}
    out = {}
    for field, pem in files.items():
        if pem.strip():
            target = folder / f"{field}.pem"
            descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(pem)
            out[field] = target
    return out


def settings_values(args: argparse.Namespace, fields) -> dict:
    """`ServerSettings` keyword values from parsed `serve` flags, with TF Serving's files folded in.

    NO_OP and WARNED flags become `tf_serving_notes` (flag, value, reason, warn), logged at start-up.
    `--version` prints the version and exits 0 (as TF Serving does).

    Raises:
        ConfigError: both --ssl_config_file and --tls-* given, --use_alts_credentials with TLS, or a bad
            SSLConfig/MonitoringConfig file.
    """
    if getattr(args, VERSION_DEST, False):
        print(version_text())
        raise SystemExit(0)
    values = {k: v for k, v in vars(args).items() if k in fields}
    notes = []
    for name, value in getattr(args, NOTES_DEST, None) or ():
        warned = name in WARNED
        if name == "enable_profiler" and value is False or name == "mixed_precision" and not value:
            continue  # asks for nothing tfship lacks
        notes.append((name, str(value), (WARNED if warned else NO_OP)[name][1], warned))
    if notes:
        values["tf_serving_notes"] = tuple(notes)
    ssl_file = getattr(args, "ssl_config_file", None)
    if ssl_file:
        given = [f"--{k.replace('_', '-')}" for k in ("tls_cert", "tls_key", "tls_client_ca") if values.get(k)]
        if given:
            raise ConfigError(f"--ssl_config_file {ssl_file} and {', '.join(given)} both set TLS; give one")
        values.update(ssl_settings(ssl_file))
    if values.get("use_alts_credentials") and (ssl_file or values.get("tls_cert")):
        raise ConfigError("Either use_alts_credentials must be false or ssl_config_file (--tls-cert) must be empty")
    monitoring = getattr(args, "monitoring_config_file", None)
    if monitoring:
        values.update(monitoring_settings(monitoring))
    base_path = getattr(args, "model_base_path", None)
    if base_path:
        values["model_base_path"] = base_path
        values["model_name"] = values.get("model_name") or "default"  # TF Serving's default --model_name
    return values

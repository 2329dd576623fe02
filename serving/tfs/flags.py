"""TF Serving's `tensorflow_model_server` command line, accepted beside tfship's own `serve` flags.

Every flag of TF Serving's main.cc is known here. Those tfship implements are aliases of its own flags
(`--model_name` = `--model-name`, `--tensorflow_intra_op_parallelism` = `--intra-op-threads`, ...), in
both `--flag=value` and `--flag value` forms; the others are refused by name, never ignored.
Semantics kept from TF Serving: `--rest_api_port=0` means REST off, `--enable_batching` takes an
optional `=true|false`, `--model_base_path` is the model's own folder (holding the version folders),
`--ssl_config_file` is an `SSLConfig` text proto holding PEM *contents* and `--monitoring_config_file`
a `MonitoringConfig` text proto (`prometheus_config { enable: true path: "..." }`).
"""

from __future__ import annotations

import argparse
import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from tfship.core.errors import ConfigError
from tfship.core.locations import cli_location, cli_path

PROMETHEUS_PATH = "/monitoring/prometheus/metrics"

# TF Serving flag -> (tfship dest, value type) for flags with the same meaning under another name.
ALIASES: dict[str, tuple[str, type]] = {
    "model_name": ("model_name", str),
    "model_config_file": ("model_config_file", cli_location),  # a file, or an s3:// object
    "batching_parameters_file": ("batching_parameters_file", cli_path),
    "file_system_poll_wait_seconds": ("file_system_poll_wait_seconds", float),
    "tensorflow_intra_op_parallelism": ("intra_op_threads", int),
    "tensorflow_inter_op_parallelism": ("inter_op_threads", int),
    "rest_api_timeout_in_ms": ("rest_api_timeout_in_ms", int),
}
# TF Serving flags tfship does not implement, with what to do instead.
REFUSED: dict[str, str] = {
    "grpc_socket_path": "tfship listens on TCP only (--host/--port)",
    "rest_api_num_threads": "REST runs on the event loop; size backend threads with --worker-threads",
    "rest_api_enable_cors_support": "put a proxy that adds CORS headers in front of the REST port",
    "allow_version_labels_for_unavailable_models": "labels must point at loaded versions",
    "enable_per_model_batching_parameters": "one --batching-parameters-file applies to every model",
    "num_load_threads": "versions load one at a time",
    "num_unload_threads": "versions unload one at a time",
    "max_num_load_retries": "a failed version is retried on the next repository poll",
    "load_retry_interval_micros": "a failed version is retried on the next repository poll",
    "flush_filesystem_caches": "not applicable",
    "tensorflow_session_parallelism": "use --intra-op-threads/--inter-op-threads",
    "tensorflow_session_config_file": "use --intra-op-threads/--inter-op-threads",
    "use_alts_credentials": "use --tls-cert/--tls-key (or --ssl_config_file)",
    "platform_config_file": "choose the runtime with --backend",
    "per_process_gpu_memory_fraction": "tfship sets no TensorFlow GPU memory options",
    "saved_model_tags": "tfship loads the 'serve' tag-set",
    "grpc_channel_arguments": "use --max-message-bytes for message sizes",
    "grpc_max_threads": "gRPC runs on asyncio; size backend threads with --worker-threads",
    "enable_model_warmup": "warm-up always runs when assets.extra/tf_serving_warmup_requests exists",
    "num_request_iterations_for_warmup": "each warm-up record is run once",
    "version": "run `tfship --help`",
    "remove_unused_fields_from_bundle_metagraph": "not applicable",
    "prefer_tflite_model": "use --backend tflite",
    "num_tflite_pools": "one LiteRT interpreter per version",
    "num_tflite_interpreters_per_pool": "one LiteRT interpreter per version",
    "enable_signature_method_name_check": "Classify/Regress always check the signature's method_name",
    "xla_cpu_compilation_enabled": "not applicable",
    "xla_gpu_compilation_enabled": "not applicable",
    "enable_profiler": "use `make bench-serve BENCH_PROFILE_S=...`",
    "thread_pool_factory_config_file": "size backend threads with --worker-threads",
    "mixed_precision": "export the model in the precision to serve",
    "skip_initialize_tpu": "no TPU support",
    "enable_grpc_healthcheck_service": "grpc.health.v1 is always on",
    "enable_serialization_as_tensor_content": "outputs are always sent as tensor_content",
}
REFUSED_DEST = "tf_serving_refused"
# Dests the aliases add beside ServerSettings' own fields; `settings_values` folds them in.
EXTRA_DESTS = ("model_base_path", "ssl_config_file", "monitoring_config_file")


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _rest_api_port(value: str) -> int:
    port = int(value)
    return -1 if port == 0 else port  # TF Serving: 0 = no REST server


class _Refuse(argparse.Action):
    """Records a TF Serving flag tfship does not implement; `settings_values` refuses it by name."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        refused = list(getattr(namespace, REFUSED_DEST, None) or [])
        refused.append(option_string)
        setattr(namespace, REFUSED_DEST, refused)


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
    for name in REFUSED:
        a(f"--{name}", action=_Refuse, nargs="?", dest=REFUSED_DEST, default=keep, help=argparse.SUPPRESS)


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
    folder = Path(tempfile.mkdtemp(prefix="tfship-ssl-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
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

    Raises:
        ConfigError: a TF Serving flag tfship does not implement (named, with what to use instead), both
            --ssl_config_file and --tls-* given, or a bad SSLConfig/MonitoringConfig file.
    """
    refused = getattr(args, REFUSED_DEST, None)
    if refused:
        reasons = "; ".join(f"{flag} ({REFUSED[flag.lstrip('-')]})" for flag in refused)
        raise ConfigError(f"TF Serving flag(s) not implemented by tfship: {reasons}")
    values = {k: v for k, v in vars(args).items() if k in fields}
    ssl_file = getattr(args, "ssl_config_file", None)
    if ssl_file:
        given = [f"--{k.replace('_', '-')}" for k in ("tls_cert", "tls_key", "tls_client_ca") if values.get(k)]
        if given:
            raise ConfigError(f"--ssl_config_file {ssl_file} and {', '.join(given)} both set TLS; give one")
        values.update(ssl_settings(ssl_file))
    monitoring = getattr(args, "monitoring_config_file", None)
    if monitoring:
        values.update(monitoring_settings(monitoring))
    base_path = getattr(args, "model_base_path", None)
    if base_path:
        values["model_base_path"] = base_path
        values["model_name"] = values.get("model_name") or "default"  # TF Serving's default --model_name
    return values

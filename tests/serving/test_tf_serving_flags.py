"""TF Serving's command line runs unchanged: every flag of its main.cc is accepted, acting or a noted no-op.

The flag list is TF Serving's (tensorflow_serving/model_servers/main.cc); SSLConfig and MonitoringConfig
files are TF Serving's text protos. A real server is started from a TF Serving-style args list.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import MODEL

from tfship.core.errors import ConfigError
from tfship.serving import cli
from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs.client import PredictClient
from tfship.serving.tfs.flags import ACTING, ALIASES, NO_OP, WARNED

# Every flag of TF Serving's main.cc (tensorflow/serving, model_servers/main.cc).
TF_SERVING_FLAGS = (
    "port grpc_socket_path rest_api_port rest_api_num_threads rest_api_timeout_in_ms rest_api_enable_cors_support "
    "enable_batching allow_version_labels_for_unavailable_models batching_parameters_file "
    "enable_per_model_batching_parameters model_config_file model_config_file_poll_wait_seconds model_name "
    "model_base_path num_load_threads num_unload_threads max_num_load_retries load_retry_interval_micros "
    "file_system_poll_wait_seconds flush_filesystem_caches tensorflow_session_parallelism "
    "tensorflow_session_config_file tensorflow_intra_op_parallelism tensorflow_inter_op_parallelism "
    "use_alts_credentials ssl_config_file platform_config_file per_process_gpu_memory_fraction saved_model_tags "
    "grpc_channel_arguments grpc_max_threads enable_model_warmup num_request_iterations_for_warmup version "
    "monitoring_config_file remove_unused_fields_from_bundle_metagraph prefer_tflite_model num_tflite_pools "
    "num_tflite_interpreters_per_pool enable_signature_method_name_check xla_cpu_compilation_enabled "
    "xla_gpu_compilation_enabled enable_profiler thread_pool_factory_config_file mixed_precision "
    "skip_initialize_tpu enable_grpc_healthcheck_service enable_serialization_as_tensor_content").split()
IMPLEMENTED = {"port", "rest_api_port", "enable_batching", "model_base_path", "model_config_file_poll_wait_seconds",
               "ssl_config_file", "monitoring_config_file", "version", *ALIASES, *ACTING}


def _settings(argv: list[str]):
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    return cli.settings_from_args(parser.parse_args(["serve", *argv]))


def test_every_tf_serving_flag_acts_or_is_a_noted_no_op():
    assert set(TF_SERVING_FLAGS) == IMPLEMENTED | set(NO_OP) | set(WARNED)
    assert not IMPLEMENTED & (set(NO_OP) | set(WARNED)) and not set(NO_OP) & set(WARNED)


@pytest.mark.parametrize("form", ["equals", "space"])
def test_tf_serving_command_line_maps_onto_tfship_settings(tmp_path, form):
    (tmp_path / "batching.txt").write_text("max_batch_size { value: 8 }\n")
    flags = {"port": "8600", "rest_api_port": "8601", "model_name": "digits", "model_base_path": "/models/digits",
             "batching_parameters_file": str(tmp_path / "batching.txt"), "file_system_poll_wait_seconds": "5",
             "tensorflow_intra_op_parallelism": "2", "tensorflow_inter_op_parallelism": "3",
             "model_config_file_poll_wait_seconds": "60"}
    argv = [part for k, v in flags.items() for part in ([f"--{k}={v}"] if form == "equals" else [f"--{k}", v])]
    settings = _settings([*argv, "--enable_batching"])
    assert (settings.port, settings.rest_port, settings.model_name, settings.model_base_path) == (
        8600, 8601, "digits", Path("/models/digits"))
    assert settings.batching_parameters_file == tmp_path / "batching.txt" and settings.enable_batching
    assert (settings.file_system_poll_wait_seconds, settings.intra_op_threads, settings.inter_op_threads) == (5, 2, 3)
    assert settings.model_config_file_poll_wait_seconds == 60
    assert not _settings(["--enable_batching=false"]).enable_batching
    assert _settings(["--rest_api_port=0"]).rest_port == -1  # TF Serving: 0 = no REST server
    assert _settings(["--model_base_path", "/m/x"]).model_name == "default"  # TF Serving's default --model_name


@pytest.mark.parametrize(("argv", "noted"), [
    (["--rest_api_num_threads=4"], ("rest_api_num_threads", "4", False)),
    (["--num_load_threads", "4", "--port", "0"], ("num_load_threads", "4", False)),
    (["--flush_filesystem_caches"], ("flush_filesystem_caches", "True", False)),
    (["--enable_profiler=true"], ("enable_profiler", "True", True)),
    (["--mixed_precision=bfloat16"], ("mixed_precision", "bfloat16", True)),
])
def test_flags_for_machinery_tfship_lacks_are_accepted_and_noted(argv, noted):
    notes = _settings(argv).tf_serving_notes
    assert [n[:2] + n[3:] for n in notes] == [noted] and notes[0][2]  # with the reason logged at start-up


def test_a_no_op_flag_never_stops_the_server_but_a_bad_value_does(capsys):
    assert not _settings(["--enable_profiler=false"]).tf_serving_notes  # asks for nothing tfship lacks
    with pytest.raises(SystemExit) as stopped:  # TensorFlow's flag parser refuses it too
        _settings(["--num_load_threads=many"])
    assert stopped.value.code == 2 and "--num_load_threads: invalid int value: 'many'" in capsys.readouterr().err


def test_tensorflow_model_server_alias_keeps_tf_servings_rest_default():
    def alias_settings(argv):
        return _settings(cli.tensorflow_model_server_argv(argv)[1:])

    assert alias_settings(["--port=8500", "--model_base_path=/m/x"]).rest_port == -1  # TF Serving: REST off
    assert alias_settings(["--port=8500", "--rest_api_port=8501", "--model_base_path=/m/x"]).rest_port == 8501


@pytest.fixture(scope="module")
def pem(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
                    "server.pem", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   cwd=d, check=True, capture_output=True)
    return d


def _ssl_config(pem: Path, path: Path, client_verify: bool | None = None, ca: bool = False) -> Path:
    fields = [f"server_key: {json.dumps((pem / 'server.key').read_text())}",
              f"server_cert: {json.dumps((pem / 'server.pem').read_text())}"]
    if ca:
        fields.append(f"custom_ca: {json.dumps((pem / 'server.pem').read_text())}")
    if client_verify is not None:
        fields.append(f"client_verify: {str(client_verify).lower()}")
    path.write_text("\n".join(fields) + "\n")
    return path


def test_ssl_config_file_becomes_tls_settings(pem, tmp_path):
    settings = _settings(["--ssl_config_file", str(_ssl_config(pem, tmp_path / "ssl.cfg", client_verify=True, ca=True))])
    assert settings.tls_cert.read_text() == (pem / "server.pem").read_text()
    assert settings.tls_key.read_text() == (pem / "server.key").read_text()
    assert settings.tls_client_ca.read_text() == (pem / "server.pem").read_text()
    assert settings.tls_key.stat().st_mode & 0o777 == 0o600
    cases = {
        _ssl_config(pem, tmp_path / "a.cfg", client_verify=True): "client_verify: true needs custom_ca",
        _ssl_config(pem, tmp_path / "b.cfg", ca=True): "custom_ca without client_verify: true",
    }
    (tmp_path / "c.cfg").write_text("server_key: 'k'\nserver_certificate: 'c'\n")
    cases[tmp_path / "c.cfg"] = f"--ssl_config_file {tmp_path / 'c.cfg'}: not a SSLConfig text proto: 2:1"
    for path, message in cases.items():
        with pytest.raises(ConfigError) as err:
            _settings(["--ssl_config_file", str(path)])
        assert message in str(err.value), str(err.value)
    with pytest.raises(ConfigError, match="both set TLS"):
        _settings(["--ssl_config_file", str(tmp_path / "ssl.cfg"), "--tls-cert", str(pem / "server.pem")])


def test_monitoring_config_file(tmp_path):
    path = tmp_path / "monitoring.cfg"
    path.write_text('prometheus_config { enable: true, path: "/monitoring/prometheus/metrics" }\n')
    assert _settings(["--monitoring_config_file", str(path)]).prometheus_path == "/monitoring/prometheus/metrics"
    path.write_text("prometheus_config { enable: true path: '/metrics2' }\n")
    assert _settings([f"--monitoring_config_file={path}"]).prometheus_path == "/metrics2"
    path.write_text("prometheus_config { enable: false }\n")
    assert _settings(["--monitoring_config_file", str(path)]).prometheus_path is None
    path.write_text("prometheus_config { enabled: true }\n")
    with pytest.raises(ConfigError, match=r"--monitoring_config_file .*monitoring.cfg: not a MonitoringConfig text "
                                          r"proto: 1:21 : .*enabled"):
        _settings(["--monitoring_config_file", str(path)])


def test_server_started_with_a_tf_serving_args_list(repository, pem, tmp_path):
    monitoring = tmp_path / "monitoring.cfg"
    monitoring.write_text('prometheus_config { enable: true path: "/tfs/metrics" }\n')
    ssl_file = _ssl_config(pem, tmp_path / "ssl.cfg")
    args = ["--model_name=handwriting", f"--model_base_path={repository / MODEL}", "--enable_batching",
            "--tensorflow_intra_op_parallelism", "1", "--file_system_poll_wait_seconds=0",
            f"--monitoring_config_file={monitoring}", "--ssl_config_file", str(ssl_file)]
    credentials = grpc.ssl_channel_credentials((pem / "server.pem").read_bytes())
    temp = tmp_path / "temp"  # the server's TMPDIR: where it writes the PEM copies of --ssl_config_file
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    with ServerProcess(repository, MODEL, extra_args=args, credentials=credentials, env=env) as server:
        copies = list(temp.glob("tfship-ssl-*/tls_key.pem"))
        assert len(copies) == 1 and copies[0].stat().st_mode & 0o777 == 0o600, copies
        with PredictClient(server.grpc_target, credentials=credentials) as client:
            assert [s.version for s in client.model_status("handwriting")] == [2]  # latest, as TF Serving
            assert client.predict("handwriting", {"image": np.zeros((2, 8, 8, 1), np.float32)})["class_id"].shape == (2,)
        context = ssl.create_default_context(cafile=str(pem / "server.pem"))
        base = server.rest_url.replace("http://", "https://")
        with urllib.request.urlopen(f"{base}/v1/models/handwriting", context=context, timeout=10) as response:
            assert json.loads(response.read())["model_version_status"][0]["state"] == "AVAILABLE"
        with urllib.request.urlopen(f"{base}/tfs/metrics", context=context, timeout=10) as response:
            assert b"# TYPE" in response.read()
    assert server.returncode == 0
    assert not list(temp.glob("tfship-ssl-*")), "the drained server left its copy of the private key behind"


def test_model_config_file_is_polled(repository, tmp_path):
    config = tmp_path / "models.config"

    def write(name: str) -> None:
        config.write_text(f'model_config_list {{ config {{ name: "{name}" base_path: "{repository / MODEL}" '
                          'model_platform: "tensorflow" } }\n')

    write("first")
    args = ["--model_config_file", str(config), "--model_config_file_poll_wait_seconds=0.2",
            "--file_system_poll_wait_seconds=0"]
    with ServerProcess(repository, MODEL, extra_args=args) as server, PredictClient(server.grpc_target) as client:
        assert [s.version for s in client.model_status("first")] == [2]
        write("second")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if [s.version for s in client.model_status("second")] == [2]:
                    break
            except Exception:  # noqa: BLE001 - NOT_FOUND until the changed file is applied
                time.sleep(0.1)
        assert [s.version for s in client.model_status("second")] == [2]


def test_container_args_list_from_a_tf_serving_manifest_runs_unchanged():
    """A Kubernetes `args:` list written for tensorflow/serving, appended by the image's entrypoint."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "entrypoint", Path(__file__).resolve().parents[2] / "deploy" / "docker" / "entrypoint.py")
    entrypoint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entrypoint)
    args = ["--port=8500", "--rest_api_port=8501", "--model_name=digits", "--model_base_path=/models/digits",
            "--file_system_poll_wait_seconds=30", "--enable_batching=true"]
    argv = entrypoint.server_argv({}, args)
    assert argv[1:3] == ["-m", "tfship.serving"]
    settings = _settings(argv[3:])
    assert (settings.model_name, settings.model_base_path, settings.port, settings.rest_port) == (
        "digits", Path("/models/digits"), 8500, 8501)
    assert settings.host == "0.0.0.0" and settings.enable_batching and settings.file_system_poll_wait_seconds == 30


def test_every_main_cc_flag_at_once_starts_a_valid_settings(tmp_path):
    """A deployment's command line naming every flag of main.cc parses; acting flags land in the settings."""
    values = {"port": "8500", "rest_api_port": "8501", "enable_batching": "true", "mixed_precision": "",
              "model_config_file_poll_wait_seconds": "0", "per_process_gpu_memory_fraction": "0.5",
              "grpc_channel_arguments": "grpc.max_concurrent_streams=8,grpc.lb_policy_name=grpclb",
              "grpc_socket_path": str(tmp_path / "tfs.sock"), "saved_model_tags": "serve,gpu",
              "model_base_path": "/m/x", "model_name": "x", "tensorflow_session_config_file": "/dev/null",
              "platform_config_file": "/dev/null", "thread_pool_factory_config_file": "/dev/null",
              "batching_parameters_file": "/dev/null", "model_config_file": "/dev/null"}
    skip = {"ssl_config_file", "monitoring_config_file", "version", "use_alts_credentials"}  # tested on their own
    bools = {name for name, (_, kind, is_bool) in ACTING.items() if is_bool} | {
        name for name, (kind, _) in {**NO_OP, **WARNED}.items() if kind is not int and kind is not str}
    argv = []
    for flag in TF_SERVING_FLAGS:
        if flag in skip:
            continue
        argv.append(f"--{flag}={values.get(flag, 'true' if flag in bools else '1')}")
    settings = _settings(argv)
    assert settings.grpc_socket_path == str(tmp_path / "tfs.sock")
    assert settings.grpc_channel_arguments == (("grpc.max_concurrent_streams", 8), ("grpc.lb_policy_name", "grpclb"))
    assert ("grpc.max_concurrent_streams", 8) in settings.grpc_options()
    assert settings.prefer_tflite_model and settings.enable_serialization_as_tensor_content
    assert settings.enable_signature_method_name_check and settings.saved_model_tags == ("gpu", "serve")
    assert settings.per_process_gpu_memory_fraction == 0.5 and settings.num_request_iterations_for_warmup == 1
    assert {n[0] for n in settings.tf_serving_notes} == set(NO_OP) | {"enable_profiler"}


@pytest.mark.parametrize("value", ["-0.1", "1.5"])
def test_gpu_memory_fraction_outside_0_1_is_a_clear_error(value):
    with pytest.raises(ConfigError, match=r"--per_process_gpu_memory_fraction must be in \(0, 1\]"):
        _settings([f"--per_process_gpu_memory_fraction={value}"])


def test_defaults_follow_tf_serving():
    settings = _settings([])
    assert not settings.enable_serialization_as_tensor_content and not settings.enable_signature_method_name_check
    assert settings.enable_model_warmup and not settings.prefer_tflite_model and settings.grpc_socket_path is None


def test_channel_arguments_need_key_value_items(capsys):
    with pytest.raises(SystemExit):
        _settings(["--grpc_channel_arguments=grpc.max_concurrent_streams"])
    assert "is not key=value" in capsys.readouterr().err
    assert _settings(["--grpc_channel_arguments="]).grpc_channel_arguments == ()
    later = _settings(["--grpc_channel_arguments=grpc.max_receive_message_length=9000"]).grpc_options()
    assert dict(later)["grpc.max_receive_message_length"] == 9000  # the deployment's value wins over tfship's


def test_use_alts_credentials_and_tls_are_exclusive(pem, tmp_path):
    with pytest.raises(ConfigError, match="Either use_alts_credentials must be false or ssl_config_file"):
        _settings(["--use_alts_credentials", "--ssl_config_file", str(_ssl_config(pem, tmp_path / "ssl.cfg"))])

"""In-process model manager (warmup, unload after in-flight), config parsing, CLI wiring and `query`."""

from __future__ import annotations

import argparse
import asyncio
import io
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import MODEL
from rich.console import Console

from tfship.core import protocol
from tfship.core.errors import ConfigError, ModelNotFoundError
from tfship.serving import cli
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import ModelConfig, VersionPolicy, parse_model_server_config
from tfship.serving.dataplane.tensors import to_tensor_proto
from tfship.serving.dataplane.types import ModelRef, VersionState
from tfship.serving.dataplane.warmup import WARMUP_FILE, encode_record, warmup_predicts
from tfship.serving.query import query_digits
from tfship.serving.runtimes import RuntimeOptions
from tfship.serving.settings import ServerSettings


def _manager(pool) -> ModelManager:
    return ModelManager("tflite", RuntimeOptions(), pool)


def test_warmup_file_written_by_tensorflow_is_read(repository):
    [(signature, inputs)] = warmup_predicts(repository / MODEL / "1")
    assert signature == "serving_default" and inputs["image"].shape == (2, 8, 8, 1)


def test_failing_warmup_fails_the_load(repository, tmp_path):
    version = tmp_path / MODEL / "1"
    shutil.copytree(repository / MODEL / "1", version)
    log = protocol.PredictionLog()
    log.predict_log.request.inputs["wrong"].CopyFrom(to_tensor_proto(np.zeros((1, 3), np.float32)))
    (version / WARMUP_FILE).write_bytes(encode_record(log.SerializeToString()))

    async def run():
        with ThreadPoolExecutor(2) as pool:
            manager = _manager(pool)
            await manager.apply_config([ModelConfig(MODEL, tmp_path / MODEL)])
            return manager.statuses(ModelRef(MODEL))

    [status] = asyncio.run(run())
    assert status.state is VersionState.END and "warmup request" in status.error_message


def test_unload_waits_for_in_flight_requests(repository):
    async def run():
        with ThreadPoolExecutor(2) as pool:
            manager = _manager(pool)
            await manager.apply_config([ModelConfig(MODEL, repository / MODEL, policy=VersionPolicy("all"))])
            served = manager.hold(ModelRef(MODEL, version=1))
            try:
                removal = asyncio.create_task(manager.apply_config([]))
                while served.state is not VersionState.UNLOADING:
                    await asyncio.sleep(0)  # yield to the removal task
                assert served.runtime is not None and not removal.done()
                out = served.runtime.predict({"image": np.zeros((1, 8, 8, 1), np.float32)})
            finally:
                manager.release(served)
            await removal
            assert served.state is VersionState.END and served.runtime is None
            with pytest.raises(ModelNotFoundError):
                manager.resolve(ModelRef(MODEL))
            return out

    assert asyncio.run(run())["class_id"].shape == (1,)


def test_model_server_config_parsing():
    [config] = parse_model_server_config("""model_config_list { config {
        name: "m" base_path: "/models/m" model_version_policy { latest { num_versions: 2 } }
        version_labels { key: "stable" value: 3 } } }""")
    assert config.policy.select([1, 2, 3, 5]) == [3, 5] and config.labels == {"stable": 3}
    with pytest.raises(ConfigError, match="invalid model name"):
        parse_model_server_config('model_config_list { config { name: "../x" base_path: "/m" } }')
    with pytest.raises(ConfigError, match="Error parsing text-format tensorflow.serving.ModelServerConfig"):
        parse_model_server_config("model_config_list { nope: 1 }", "bad.config")
    assert VersionPolicy("specific", versions=(2, 9)).select([1, 2, 3]) == [2]


def test_register_adds_serve_and_query():
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--repository", "models", "--model-name", "digits", "--backend", "onnx",
                              "--rest-port", "-1", "--file-system-poll-wait-seconds", "5", "--enable-batching"])
    settings = ServerSettings(**{k: v for k, v in vars(args).items() if k in ServerSettings.model_fields})
    assert settings.backend == "onnx" and settings.rest_port == -1 and settings.enable_batching
    assert args.func is cli.run_serve
    query = parser.parse_args(["query", "--target", "h:1", "--model-name", "digits"])
    assert query.count == 20 and query.signature_name == "serving_default" and query.func is cli.run_query


def test_query_prints_table_and_accuracy(server):
    buffer = io.StringIO()
    from tfship.pipeline.data.splits import held_out_digits

    images, labels = held_out_digits(5)
    assert query_digits(server.grpc_target, MODEL, images, labels, console=Console(file=buffer, width=100)) == 0
    text = buffer.getvalue()
    assert "predicted" in text and "accuracy:" in text and "on 5 rows" in text


def test_environment_overrides_defaults_but_not_flags(monkeypatch):
    monkeypatch.setenv("TFSHIP_SERVING_REST_PORT", "-1")
    monkeypatch.setenv("TFSHIP_SERVING_ENABLE_BATCHING", "true")
    monkeypatch.setenv("TFSHIP_SERVING_BACKEND", "tflite")
    parser = argparse.ArgumentParser()
    cli.add_serve_arguments(parser)
    args = parser.parse_args(["--backend", "onnx"])
    assert args.rest_port == -1 and args.enable_batching and args.backend == "onnx"
    monkeypatch.setenv("TFSHIP_SERVING_PORT", "eighty")
    with pytest.raises(ConfigError, match="TFSHIP_SERVING_PORT='eighty'"):
        cli.add_serve_arguments(argparse.ArgumentParser())

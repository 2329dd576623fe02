"""Server settings: one pydantic model, filled from the `serve` CLI flags."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from tfship.core.locations import pydantic_validator
from tfship.serving.runtimes import backend_names


class ServerSettings(BaseModel):
    """Everything `python -m tfship.serving` needs. Ports: 0 = any free port; -1 = transport off (REST/metrics)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    repository: Annotated[Any, BeforeValidator(pydantic_validator("--repository", buckets=True))] = Field(
        None, description="Model repository (<repository>/<model_name>/<version>/): a folder or s3://BUCKET/PREFIX.")
    model_name: str | None = Field(None, description="Model served from --repository.")
    model_config_file: Annotated[Any, BeforeValidator(pydantic_validator("--model-config-file", buckets=True))] = \
        Field(None, description="TF Serving ModelServerConfig text file, or an s3:// object (polled alike).")
    model_config_file_poll_wait_seconds: float = Field(0.0, ge=0, description="Re-read --model-config-file every "
                                                       "N seconds and apply changes (TF Serving); 0 = never.")
    model_base_path: Annotated[Any, BeforeValidator(pydantic_validator("--model_base_path", buckets=True))] = Field(
        None, description="The model's own folder of versions (TF Serving's --model_base_path), served as "
                          "--model-name: a folder or s3://BUCKET/PREFIX.")
    model_cache_dir: Path | None = Field(None, description="Where versions served from a bucket are cached "
                                                           "(default: <temp>/tfship-model-cache).")
    prometheus_path: str | None = Field("/monitoring/prometheus/metrics", description="Prometheus text on the "
                                        "REST port at this path (--monitoring_config_file); None = not served.")
    backend: str = Field("auto", description="Runtime backend: `auto` or a name in the runtime registry.")
    tflite_file: str = Field("model.tflite", description="TFLite artifact served by the tflite backend.")
    host: str = Field("127.0.0.1", description="Address every port binds to.")
    port: int = Field(8500, ge=0, le=65535, description="gRPC port.")
    rest_port: int = Field(8501, ge=-1, le=65535, description="REST port; -1 = off.")
    metrics_port: int = Field(-1, ge=-1, le=65535, description="Prometheus port; -1 = off.")
    port_file: Path | None = Field(None, description="Write bound ports here as JSON once listening.")
    file_system_poll_wait_seconds: float = Field(1.0, ge=0, description="Repository poll interval; 0 = off.")
    intra_op_threads: int = Field(0, ge=0, description="Threads inside one op; 0 = backend default.")
    inter_op_threads: int = Field(0, ge=0, description="Threads across ops (ONNX Runtime); 0 = default.")
    worker_threads: int = Field(16, ge=1, description="Threads running backend calls.")
    enable_batching: bool = Field(False, description="Merge concurrent requests (Batched runtime).")
    batching_parameters_file: Path | None = Field(None, description="TF Serving BatchingParameters text file.")
    max_message_bytes: int = Field(64 << 20, ge=1024, description="Largest gRPC/REST message, bytes.")
    max_batch_per_request: int = Field(1024, ge=0, description="Largest batch (dim 0) per request; 0 = unlimited "
                                                               "(default 1024: a serving-sized batch).")
    max_request_memory_bytes: int = Field(256 << 20, ge=0, description="Largest inputs + outputs one request may "
                                                                       "hold, bytes; 0 = unlimited.")
    max_concurrent_requests: int = Field(0, ge=0, description="Predicts at once; 0 = unlimited.")
    default_deadline_s: float = Field(0.0, ge=0, description="Deadline when the client sets none; 0 = none.")
    rest_api_timeout_in_ms: int = Field(30000, ge=1, description="REST: a request's headers and body must arrive "
                                                                  "within this time; idle connections close after it.")
    grace_period_s: float = Field(10.0, ge=0, description="SIGTERM: time in-flight requests get to finish.")
    tls_cert: Path | None = Field(None, description="Server certificate (PEM); enables TLS.")
    tls_key: Path | None = Field(None, description="Server private key (PEM).")
    tls_client_ca: Path | None = Field(None, description="Client CA (PEM); enables mutual TLS.")
    auth_token_file: Path | None = Field(None, description="File of inference bearer tokens "
                                           "(serving.operations.security).")
    auth_token_env: str | None = Field(None, description="Env var holding inference tokens, comma-separated.")
    admin_token_file: Path | None = Field(None, description="File of admin tokens (reload); turns admin calls on.")
    admin_token_env: str | None = Field(None, description="Env var holding admin tokens, comma-separated.")
    enable_admin_api: bool = Field(False, description="Allow admin calls without admin tokens (no auth at all).")
    json_logs: bool = Field(False, description="Log one JSON object per line.")
    request_log_sampling_rate: float = Field(0.0, ge=0.0, le=1.0, description="Fraction of requests logged as one "
                                             "structured line each (serving.operations.request_log); "
                                             "0 = off (default).")
    num_processes: int = Field(1, ge=1, description="Server processes sharing the ports (SO_REUSEPORT).")
    reuse_port: bool = Field(False, description="Bind the REST port with SO_REUSEPORT (set for --num-processes "
                                                "workers; gRPC always does on Linux).")

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value not in backend_names():
            raise ValueError(f"unknown backend {value!r}; choose from {list(backend_names())}")
        return value

    def access_policy(self):
        """The `serving.operations.security.AccessPolicy` these settings define; raises `ConfigError` (see there)."""
        from tfship.serving.operations.security import access_policy

        return access_policy(self)

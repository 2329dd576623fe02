"""Server settings: one pydantic model, filled from the `serve` CLI flags."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from tfship.core.locations import pydantic_validator
from tfship.serving.runtimes import backend_names

if TYPE_CHECKING:
    from tfship.serving.operations.security import AccessPolicy


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
    artifact: str | None = Field(None, description="Serve this artifact of each version's manifest.json (e.g. "
                                 "tflite_int8): its file on its backend; refused where not published "
                                 "(serving.runtimes.published).")
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
    batch_thread_nice: int = Field(0, ge=0, le=19, description="Nice value of the batch threads (0 = unchanged); "
                                   "on a core shared with the transport, batches then fill with the requests "
                                   "decoded while one runs.")
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
    lenient_fixed_dimensions: bool = Field(False, description="Feed the model an input sent at its declared rank "
                                           "whose size contradicts a fixed dimension, as TF Serving does "
                                           "(default: refused naming the declared shape).")
    request_log_sampling_rate: float = Field(0.0, ge=0.0, le=1.0, description="Fraction of requests logged as one "
                                             "structured line each (serving.operations.request_log); "
                                             "0 = off (default).")
    pin_transport_threads: bool = Field(True, description="Run the gRPC and REST threads on one shared core "
                                        "(serving.affinity); False with --spread-transport-threads.")
    num_processes: int = Field(1, ge=1, description="Server processes sharing the ports (SO_REUSEPORT).")
    reuse_port: bool = Field(False, description="Bind the REST port with SO_REUSEPORT (set for --num-processes "
                                                "workers; gRPC always does on Linux).")

    shadow: tuple[str, ...] = Field((), description="MODEL=VERSION or MODEL=LABEL: also run a sampled share of the "
                                    "model's Predicts on that version and compare (serving.dataplane.shadow).")
    shadow_rate: float = Field(0.1, ge=0.0, le=1.0, description="Share of requests shadowed (0..1).")
    shadow_queue_size: int = Field(64, ge=1, description="Shadow pairs waiting at most; more are dropped, counted.")
    shadow_queue_bytes: int = Field(256 << 20, ge=1, description="Bytes of arrays the shadow queue holds at most.")
    shadow_workers: int = Field(1, ge=1, description="Shadow calls at once (own threads).")
    shadow_timeout_s: float = Field(10.0, gt=0, description="A shadow call's limit (the primary's deadline may end "
                                    "it sooner), seconds.")
    shadow_keep_inputs: bool = Field(False, description="Keep inputs in the worst-disagreement sample (privacy: off).")
    shadow_atol: float = Field(1e-5, ge=0, description="Value bound, absolute part (the gate's float32 atol).")
    shadow_rtol: float = Field(1e-5, ge=0, description="Value bound, relative part (the gate's float32 rtol).")
    shadow_report_dir: Path | None = Field(None, description="Each process writes its report part here "
                                           "(default <temp>/tfship-shadow/<grpc port>, removed at stop).")

    # TF Serving's flags with TF Serving's meaning (serving.tfs.flags.ACTING; docs/tf-serving.md).
    grpc_socket_path: str | None = Field(None, description="Also serve gRPC on this Unix socket (TF Serving's "
                                         "--grpc_socket_path): same services, credentials and access policy.")
    grpc_channel_arguments: tuple[tuple[str, int | str], ...] = Field(
        (), description="gRPC server options (--grpc_channel_arguments key=value,...); they override tfship's own.")
    prefer_tflite_model: bool = Field(False, description="Serve model.tflite with LiteRT where a version folder "
                                                         "has one, else as --backend says (TF Serving's flag).")
    enable_serialization_as_tensor_content: bool = Field(False, description="gRPC Predict answers in tensor_content "
                                                         "bytes; default: the typed fields (float_val, ...).")
    enable_signature_method_name_check: bool = Field(False, description="Classify/Regress check the signature's "
                                                     "method_name (TF Serving's flag; off by default).")
    per_process_gpu_memory_fraction: float = Field(0.0, description="Fraction of each GPU's memory "
                                                   "TensorFlow may take (SavedModel backend); 0 = TensorFlow's "
                                                   "default. No effect without a GPU.")
    saved_model_tags: tuple[str, ...] | None = Field(None, description="Tag-set of the MetaGraph to load "
                                                     "(--saved_model_tags); None = the 'serve' MetaGraph.")
    allow_ops: tuple[str, ...] = Field((), description="Op names the op policy allows in a SavedModel although "
                                       "they touch the host (--allow-ops PrintV2,WriteFile; core.op_policy), and "
                                       "TFLite custom ops a .tflite file may use (serving.runtimes.tflite_check).")
    verify_key: Path | None = Field(None, description="PEM EC public key (--verify-key): only versions signed by it "
                                    "for their model name and version load (serving.storage.signed); None: off.")
    enable_model_warmup: bool = Field(True, description="Replay assets.extra/tf_serving_warmup_requests at load.")
    num_request_iterations_for_warmup: int = Field(0, ge=0, description="Times each warm-up record runs; "
                                                   "0 = once (TF Serving: used only if > 0).")
    use_alts_credentials: bool = Field(False, description="gRPC with Google ALTS credentials (GCP only).")
    rest_api_enable_cors_support: bool = Field(False, description="CORS headers on REST answers; OPTIONS "
                                                                  "preflights answered (serving.tfs.cors).")
    tf_serving_notes: tuple[tuple[str, str, str, bool], ...] = Field(
        (), description="TF Serving flags accepted without effect: (flag, value, reason, warn); logged at start.")

    @field_validator("shadow", mode="before")
    @classmethod
    def _shadow_list(cls, value: Any) -> Any:
        """TFSHIP_SERVING_SHADOW=a=canary,b=3 gives one string: the comma-separated MODEL=TARGET items."""
        return tuple(item.strip() for item in value.split(",") if item.strip()) if isinstance(value, str) else value

    @field_validator("verify_key")
    @classmethod
    def _verify_key(cls, value: Path | None) -> Path | None:
        """A `--verify-key` that cannot verify stops the server at start: the extra missing, the key unusable."""
        if value is not None:
            from tfship.serving.storage.signed import SignatureError, check_verify_key

            try:
                check_verify_key(value)
            except SignatureError as err:
                raise ValueError(f"--verify-key: {err}") from None
        return value

    @field_validator("per_process_gpu_memory_fraction")
    @classmethod
    def _fraction(cls, value: float) -> float:
        if value < 0.0 or value > 1.0:
            raise ValueError(f"--per_process_gpu_memory_fraction must be in (0, 1] (0 = TensorFlow's default), "
                             f"got {value}")
        return value

    def runtime_options(self):
        """The `serving.runtimes.RuntimeOptions` every runtime of this server is created with."""
        from tfship.serving.runtimes import RuntimeOptions

        return RuntimeOptions(intra_op_threads=self.intra_op_threads, inter_op_threads=self.inter_op_threads,
                              tflite_file=self.tflite_file, prefer=("tflite",) if self.prefer_tflite_model else (),
                              saved_model_tags=self.saved_model_tags,
                              gpu_memory_fraction=self.per_process_gpu_memory_fraction,
                              warmup=self.enable_model_warmup, warmup_iterations=self.num_request_iterations_for_warmup,
                              artifact=self.artifact, allow_ops=self.allow_ops, verify_key=self.verify_key)

    def grpc_options(self) -> list[tuple[str, int | str]]:
        """Options of the gRPC server: tfship's message limits and port sharing, then --grpc_channel_arguments, one
        entry per key (a later occurrence wins, as TF Serving documents for repeated keys).
        """
        options: dict[str, int | str] = {
            # gRPC itself may take up to twice --max-message-bytes: the handlers refuse anything above the limit
            # with RESOURCE_EXHAUSTED naming the flag and both sizes (gRPC's own refusal names neither).
            "grpc.max_receive_message_length": min(2 * self.max_message_bytes, (1 << 31) - 1),
            "grpc.max_send_message_length": self.max_message_bytes,
            "grpc.so_reuseport": 1 if self.reuse_port else 0,  # sharing a port only when asked
        }
        for key, value in self.grpc_channel_arguments:
            options.pop(key, None)
            options[key] = value
        return list(options.items())

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value not in backend_names():
            raise ValueError(f"unknown backend {value!r}; choose from {list(backend_names())}")
        return value

    def access_policy(self) -> AccessPolicy:
        """The `serving.operations.security.AccessPolicy` these settings define; raises `ConfigError` (see there)."""
        from tfship.serving.operations.security import access_policy

        return access_policy(self)

"""Open Inference Protocol (KServe V2) requests <-> the data plane's types, shared by gRPC and REST.

A V2 inference request becomes the same `InferenceRequest` a TF Serving Predict does, and is served by
the same `DataPlane.predict` (lookup, validation, limits, batching, metrics). What V2 adds is checked
here, with V2's words: datatypes against the signature, requested outputs, and request parameters.

Mapping (tfship's choices where the protocol leaves them to the server):
  * `model_version`: "" = latest AVAILABLE version; ASCII digits = that version; anything else = a TF
    Serving version label (`version_labels` in the model config).
  * tensors: the signature `serving_default`, or the one named by the request parameter `signature_name`.
  * request parameter `timeout` (microseconds, as Triton's) bounds the request like a gRPC deadline.
  * Triton's sequence parameters and the classification extension are refused (INVALID_ARGUMENT):
    tfship's models are stateless Predict signatures. Other parameters are accepted and ignored.
"""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tfship.core.contract import Signature, TensorSpec
from tfship.core.echo import echo
from tfship.core.errors import InvalidRequestError, ResourceExhaustedError
from tfship.serving.dataplane.types import InferenceRequest, InferenceResponse, ModelMetadata, ModelRef
from tfship.serving.kserve.codec import datatype_for

SERVER_NAME = "tfship"
EXTENSIONS = ("binary_tensor_data", "model_configuration")  # Triton's names: binary HTTP tensors, ModelConfig
DEFAULT_SIGNATURE = "serving_default"
# Runtime name -> the platform string Triton/KServe use for that framework.
PLATFORMS = {"saved_model": "tensorflow_savedmodel", "onnx": "onnxruntime_onnx", "tflite": "tensorflow_tflite"}
_REFUSED_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")


def server_version() -> str:
    """Tfship's installed version (`0+unknown` when run from a source tree that is not installed)."""
    try:
        return importlib.metadata.version("tfship")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def model_ref(name: str, version: str) -> ModelRef:
    """V2 model name and version string -> `ModelRef` ("" latest, digits a version, else a label).

    Raises:
        InvalidRequestError: empty model name.
    """
    if not name:
        raise InvalidRequestError("model name is required")
    if not version:
        return ModelRef(name)
    if version.isascii() and version.isdigit():
        return ModelRef(name, version=int(version))
    return ModelRef(name, label=version)


@dataclass(frozen=True)
class TensorMetadata:
    """One input or output in V2 model metadata: datatype and shape with -1 for a variable dim."""

    name: str
    datatype: str
    shape: list[int]


@dataclass(frozen=True)
class ModelInfo:
    """V2 model metadata: name, AVAILABLE versions (strings), platform, and the default signature's tensors."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


def signature_of(signatures: Mapping[str, Signature], name: str) -> Signature:
    """The signature `name` of a served version; `InvalidRequestError` naming the available ones otherwise."""
    signature = signatures.get(name)
    if signature is None:
        raise InvalidRequestError(f"signature {echo(name)} not found; available: {sorted(signatures)} (choose one with "
                                  "the request parameter 'signature_name')")
    return signature


def _tensor(name: str, spec: TensorSpec) -> TensorMetadata:
    shape = [-1] if spec.shape is None else [-1 if d is None else int(d) for d in spec.shape]
    return TensorMetadata(name, datatype_for(spec.dtype), shape)


def model_info(meta: ModelMetadata, versions: list[int]) -> ModelInfo:
    """V2 metadata from the data plane's `ModelMetadata` (its `serving_default`, else its only signature)."""
    signatures = meta.signatures
    name = DEFAULT_SIGNATURE if DEFAULT_SIGNATURE in signatures or len(signatures) != 1 else next(iter(signatures))
    signature = signature_of(signatures, name)
    return ModelInfo(
        name=meta.model_name,
        versions=[str(v) for v in versions],
        platform=PLATFORMS.get(meta.backend, meta.backend),
        inputs=[_tensor(k, s) for k, s in signature.inputs.items()],
        outputs=[_tensor(k, s) for k, s in signature.outputs.items()],
    )


def artifact_parameters(artifact) -> dict[str, str]:
    """The V2 model metadata `parameters` naming the published artifact that answers (`tfship serve --artifact`):
    `artifact`, `artifact_backend`, `artifact_file` and `artifact_sha256` (V2 parameters hold scalars only).

    Args:
        artifact: `serving.runtimes.published.PublishedArtifact`.
    """
    return {"artifact": artifact.name, "artifact_backend": artifact.backend, "artifact_file": artifact.file,
            "artifact_sha256": artifact.sha256}


def verification_parameters(verification) -> dict[str, str | int]:
    """The V2 model metadata `parameters` of a version verified under `--verify-key`: `signature_manifest_sha256`,
    `signature_key_id`, `signature_signed_files` and `op_policy` (the V2 gRPC ModelMetadataResponse has no
    parameters field: REST only).
    """
    return {"signature_manifest_sha256": verification["manifest_sha256"],
            "signature_key_id": verification["key_id"], "signature_signed_files": verification["signed_files"],
            "op_policy": verification["op_policy"]}


@dataclass(frozen=True)
class ConfigTensor:
    """One input or output in Triton's model configuration: `TYPE_*` data type and dims (-1 variable)."""

    name: str
    data_type: str
    dims: list[int]


@dataclass(frozen=True)
class ModelConfigInfo:
    """Triton's ModelConfig as tfship fills it (the default signature, as in `model_info`)."""

    name: str
    platform: str
    backend: str
    max_batch_size: int
    inputs: list[ConfigTensor]
    outputs: list[ConfigTensor]


def model_config(meta: ModelMetadata, max_batch_per_request: int) -> ModelConfigInfo:
    """Triton's model configuration of the default signature.

    When every input and output has a variable first dimension (the batch), `max_batch_size` is the
    server's `--max-batch-per-request` (2^31 - 1 when unlimited) and dims leave the batch out, as Triton's
    do; otherwise `max_batch_size` is 0 and dims are the full shapes.
    """
    info = model_info(meta, [])
    tensors = info.inputs + info.outputs
    batched = all(t.shape and t.shape[0] == -1 for t in tensors)
    limit = min(max_batch_per_request or (1 << 31) - 1, (1 << 31) - 1)

    def config(tensor: TensorMetadata) -> ConfigTensor:
        data_type = "TYPE_STRING" if tensor.datatype == "BYTES" else f"TYPE_{tensor.datatype}"
        return ConfigTensor(tensor.name, data_type, tensor.shape[1:] if batched else tensor.shape)

    return ModelConfigInfo(info.name, info.platform, meta.backend, limit if batched else 0,
                           [config(t) for t in info.inputs], [config(t) for t in info.outputs])


@dataclass(frozen=True)
class InferOptions:
    """What a V2 request's parameters ask: the signature and a deadline (time.monotonic() seconds)."""

    signature_name: str = DEFAULT_SIGNATURE
    deadline: float | None = None


def infer_options(parameters: Mapping[str, object], time_remaining: float | None = None) -> InferOptions:
    """Read `signature_name` and `timeout` (µs) from request parameters; refuse the sequence parameters.

    `time_remaining`: the gRPC deadline in seconds, if any; the earlier of the two wins.

    Raises:
        InvalidRequestError: a sequence parameter, a non-string `signature_name`, a `timeout` that is not
            a positive integer.
    """
    refused = [p for p in _REFUSED_PARAMETERS if p in parameters]
    if refused:
        raise InvalidRequestError(f"parameter {echo(refused[0])}: sequence batching is not supported; tfship serves "
                                  "stateless models")
    signature_name = parameters.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(signature_name, str) or not signature_name:
        raise InvalidRequestError(f"parameter 'signature_name' must be a non-empty string, got {echo(signature_name)}")
    budgets = [] if time_remaining is None else [time_remaining]
    timeout_us = parameters.get("timeout")
    if timeout_us is not None:
        if type(timeout_us) is not int or timeout_us <= 0:
            raise InvalidRequestError(f"parameter 'timeout' must be a positive integer (microseconds), got "
                                      f"{echo(timeout_us)}")
        budgets.append(timeout_us / 1e6)
    deadline = time.monotonic() + min(budgets) if budgets else None
    return InferOptions(signature_name, deadline)


def check_inputs(signature: Signature, inputs: list[tuple[str, str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Inputs as `{name: array}` after checking names are unique and datatypes match the signature.

    `inputs`: (name, datatype, decoded array) in request order. Missing/unknown inputs and shapes are
    left to the data plane (`serving.dataplane.contract.validate_inputs`), which names the expected spec.

    Raises:
        InvalidRequestError: an input named twice or without a name; a datatype that is not the model's.
    """
    arrays: dict[str, np.ndarray] = {}
    for name, datatype, array in inputs:
        if not name:
            raise InvalidRequestError("every input needs a name")
        if name in arrays:
            raise InvalidRequestError(f"input {echo(name)} is given twice")
        spec = signature.inputs.get(name)
        if spec is not None:
            want = datatype_for(spec.dtype)
            if datatype != want:
                raise InvalidRequestError(f"input {echo(name)}: datatype {datatype} does not match the model's "
                                          f"{want} (signature {signature.name!r}: {spec.describe()})")
        arrays[name] = array
    return arrays


def check_outputs(signature: Signature, names: list[str]) -> tuple[str, ...]:
    """Requested output names (empty: every output) after checking each is the signature's, once.

    Raises:
        InvalidRequestError: an unknown output (the message lists the model's outputs) or one named twice.
    """
    unknown = [n for n in names if n not in signature.outputs]
    if unknown:
        raise InvalidRequestError(f"requested output {echo(unknown[0])} is not an output of signature "
                                  f"{signature.name!r}; outputs: {list(signature.outputs)}")
    if len(set(names)) != len(names):
        raise InvalidRequestError(f"outputs {names} name an output twice")
    return tuple(names)


def predict_request(meta: ModelMetadata, options: InferOptions, inputs: dict[str, np.ndarray],
                    outputs: tuple[str, ...]) -> InferenceRequest:
    """The data plane request, pinned to the version `meta` resolved (its signatures were the ones checked)."""
    return InferenceRequest(model=ModelRef(meta.model_name, version=meta.version), inputs=inputs,
                            signature_name=options.signature_name, output_filter=outputs, deadline=options.deadline,
                            check_shapes=True)  # the protocol declares shapes; every backend checks them


def ordered_outputs(response: InferenceResponse, signature: Signature,
                    requested: tuple[str, ...]) -> list[tuple[str, np.ndarray]]:
    """Outputs in the `requested` order, or in the signature's order when every output was asked for."""
    names = list(requested) or [n for n in signature.outputs if n in response.outputs]
    names += [n for n in response.outputs if n not in names]
    return [(n, np.asarray(response.outputs[n])) for n in names]


def check_response_size(outputs: list[tuple[str, np.ndarray]], max_bytes: int) -> None:
    """Refuse a response whose tensors alone exceed `max_bytes` (`--max-message-bytes`), before encoding it.

    Raises:
        ResourceExhaustedError: naming the size, the limit and the flag.
    """
    size = 0
    for _name, array in outputs:
        if array.dtype.kind == "O":
            size += sum(len(v) if isinstance(v, bytes) else len(str(v)) for v in array.reshape(-1)) + 4 * array.size
        else:
            size += array.nbytes
    if size > max_bytes:
        raise ResourceExhaustedError(f"response tensors hold {size} bytes, above the limit of {max_bytes} bytes "
                                     "(--max-message-bytes); request fewer rows or fewer outputs")

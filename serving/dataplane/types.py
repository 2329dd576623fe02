"""The data plane's request and response types: what every transport converts to and from."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tfship.core.contract import Signature
from tfship.core.echo import clip

if TYPE_CHECKING:  # the request types import only core at run time
    from tfship.serving.runtimes.published import PublishedArtifact


@dataclass(frozen=True)
class ModelRef:
    """Which servable a request targets (TF Serving's `ModelSpec`): version and label are exclusive.

    `version` None and `label` None mean the latest (highest) available version.
    """

    name: str
    version: int | None = None
    label: str | None = None

    def describe(self) -> str:
        """TF Serving's wording: `Specific(name, 3)`, `Label(name, stable)` or `Latest(name)`."""
        if self.version is not None:
            return f"Specific({clip(self.name)}, {self.version})"
        if self.label is not None:
            return f"Label({clip(self.name)}, {clip(self.label)})"
        return f"Latest({clip(self.name)})"


@dataclass(frozen=True)
class InferenceRequest:
    """One Predict call. `inputs`: alias -> array (batch on dim 0); `output_filter`: aliases to return, empty = all.

    `check_shapes`: check ranks and fixed dimensions whatever the backend (the Open Inference Protocol); False
    (TF Serving's API) leaves them to the model on backends that feed by name (`Runtime.model_judges_shapes`).
    """

    model: ModelRef
    inputs: Mapping[str, np.ndarray]
    signature_name: str = "serving_default"
    output_filter: tuple[str, ...] = ()
    deadline: float | None = None  # time.monotonic() seconds, None = no deadline
    check_shapes: bool = False


@dataclass(frozen=True)
class InferenceResponse:
    """Predict result: the version that served it and alias -> array outputs."""

    model_name: str
    version: int
    signature_name: str
    outputs: Mapping[str, np.ndarray]


@dataclass(frozen=True)
class ModelMetadata:
    """GetModelMetadata result: the served version and its signatures by name.

    `artifact`: the published artifact that answers (`serving.runtimes.published.PublishedArtifact`: name,
    file, backend, sha256) when the server runs `--artifact NAME`; None when the backend and file flags chose.
    """

    model_name: str
    version: int
    signatures: Mapping[str, Signature]
    backend: str = ""  # the runtime's registry name (`saved_model`, `onnx`, `tflite`)
    artifact: PublishedArtifact | None = None
    # under --verify-key: {manifest_sha256, key_id, signed_files, op_policy} of the verified version; None otherwise
    verification: Mapping[str, str | int] | None = None


class VersionState(enum.Enum):
    """TF Serving's `ModelVersionStatus.State` names (values are the proto numbers)."""

    UNKNOWN = 0
    START = 10
    LOADING = 20
    AVAILABLE = 30
    UNLOADING = 40
    END = 50


@dataclass(frozen=True)
class VersionStatus:
    """GetModelStatus entry: state plus the error (gRPC code name and message) if loading failed; `artifact`:
    the published artifact the version serves under `--artifact` (None otherwise, or before it loaded).
    """

    version: int
    state: VersionState
    error_code: str = "OK"
    error_message: str = ""
    artifact: PublishedArtifact | None = None


@dataclass(frozen=True)
class ServerLimits:
    """Per-request limits enforced by the data plane.

    Attributes:
        max_batch_per_request: largest batch (dim 0) one Predict may carry; 0 = unlimited.
        max_concurrent_requests: Predicts served at once before RESOURCE_EXHAUSTED; 0 = unlimited.
        default_deadline_s: deadline applied when the client sets none, seconds; 0 = none.
        max_tensor_bytes: largest decoded input tensor, bytes (the server passes --max-message-bytes): bounds
            TensorProtos whose few values "fill" a large shape.
        max_request_memory_bytes: largest inputs + outputs one Predict may hold, bytes; 0 = unlimited.
    """

    max_batch_per_request: int = 0
    max_concurrent_requests: int = 0
    default_deadline_s: float = 0.0
    max_tensor_bytes: int = 64 << 20
    max_request_memory_bytes: int = 0

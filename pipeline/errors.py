"""One exception root for tfship, with the gRPC status each kind maps to.

Importing this module needs neither TensorFlow nor grpc: status codes are carried by name
(`grpc.StatusCode` member names) and resolved by the transport layer.
"""

from __future__ import annotations


class TfshipError(Exception):
    """Root of every error tfship raises on purpose.

    Attributes:
        grpc_code: name of the `grpc.StatusCode` member this error is answered with.
        http_status: HTTP status for the REST transport (TF Serving's REST API mapping).
    """

    grpc_code: str = "INTERNAL"
    http_status: int = 500


class ConfigError(TfshipError):
    """A config file, field or CLI override is invalid (names the file, field and value)."""

    grpc_code = "INVALID_ARGUMENT"
    http_status = 400


class DatasetError(TfshipError):
    """A dataset file, column or label is unusable (names the file and what was wrong)."""

    grpc_code = "INVALID_ARGUMENT"
    http_status = 400


class StageError(TfshipError):
    """A pipeline stage failed; the message names the stage and the reason."""


class AuditError(StageError):
    """The exported graph holds a gradient, optimizer or training-only op or variable."""


class ContractError(StageError):
    """A written SignatureDef or converted artifact disagrees with the declared contract."""


class ParityError(StageError):
    """An artifact's outputs differ from the SavedModel's beyond tolerance."""


class ConversionError(StageError):
    """A converter failed, crashed or produced an artifact that does not load or run."""


class InvalidRequestError(TfshipError):
    """A request is malformed: unknown signature, missing or extra input, wrong dtype or shape."""

    grpc_code = "INVALID_ARGUMENT"
    http_status = 400


class ModelNotFoundError(TfshipError):
    """The requested model, version or version label does not exist or is not loaded."""

    grpc_code = "NOT_FOUND"
    http_status = 404


class UnavailableError(TfshipError):
    """The model exists but no version is ready to serve yet, or the server is draining."""

    grpc_code = "UNAVAILABLE"
    http_status = 503


class ResourceExhaustedError(TfshipError):
    """A queue or limit is full (batch queue, concurrency or message size)."""

    grpc_code = "RESOURCE_EXHAUSTED"
    http_status = 429


class DeadlineExceededError(TfshipError):
    """The request's deadline passed before it was served."""

    grpc_code = "DEADLINE_EXCEEDED"
    http_status = 504


class RequestTimeoutError(TfshipError):
    """The client did not send its whole request in time (slow or stalled REST body)."""

    grpc_code = "DEADLINE_EXCEEDED"
    http_status = 408


class UnauthenticatedError(TfshipError):
    """The request carries no valid bearer token."""

    grpc_code = "UNAUTHENTICATED"
    http_status = 401


class PermissionDeniedError(TfshipError):
    """The caller is authenticated but may not make this call (e.g. an admin call with an inference token)."""

    grpc_code = "PERMISSION_DENIED"
    http_status = 403


class UnimplementedError(TfshipError):
    """The method exists in TF Serving's API but this model has no signature for it."""

    grpc_code = "UNIMPLEMENTED"
    http_status = 501

"""One exception root for tfship and ONE table from error kind to gRPC code, HTTP status and CLI exit code.

Importing this module needs neither TensorFlow nor grpc: gRPC codes are carried by name (`grpc.StatusCode`
member names) and resolved by the transport. The HTTP status of each gRPC code follows TF Serving's REST
server (`ToHTTPStatusCode` in tensorflow_serving/model_servers/http_server.cc), so a REST client sees the
status TF Serving would send for the same failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T", str, int)


class _StatusField(Generic[T]):
    """Reads one field of the error's `ErrorStatus`, on the class (`ConfigError.grpc_code`) or an instance."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, error: TfshipError | None, kind: type[TfshipError]) -> T:
        return getattr(status_of(kind if error is None else error), self.name)


class TfshipError(Exception):
    """Root of every error tfship raises on purpose; its statuses come from `STATUS_TABLE`.

    Attributes:
        grpc_code: name of the `grpc.StatusCode` member this error is answered with (e.g. `INVALID_ARGUMENT`).
        http_status: HTTP status for the REST transport (TF Serving's mapping of that gRPC code).
        exit_code: exit status of a CLI that stops on this error.
    """

    grpc_code = _StatusField[str]()
    http_status = _StatusField[int]()
    exit_code = _StatusField[int]()


class ConfigError(TfshipError):
    """A config file, field or CLI override is invalid (names the file, field and value)."""


class DatasetError(TfshipError):
    """A dataset file, column or label is unusable (names the file and what was wrong)."""


class StageError(TfshipError):
    """A pipeline stage failed; the message names the stage and the reason."""


class AuditError(StageError):
    """The exported graph holds a gradient, optimizer or training-only op or variable."""


class OpPolicyError(AuditError):
    """A SavedModel holds an op the op policy refuses (`core.op_policy`): it would touch the host."""


class ContractError(StageError):
    """A written SignatureDef or converted artifact disagrees with the declared contract."""


class ParityError(StageError):
    """An artifact's outputs differ from the SavedModel's beyond tolerance."""


class ConversionError(StageError):
    """A converter failed, crashed or produced an artifact that does not load or run."""


class InvalidRequestError(TfshipError):
    """A request is malformed: unknown signature, missing or extra input, wrong dtype or shape."""


class ModelNotFoundError(TfshipError):
    """The requested model, version or version label does not exist or is not loaded."""


class FailedPreconditionError(TfshipError):
    """The system is not in the state the operation needs (a version failed to load, the engine refused)."""


class UnavailableError(TfshipError):
    """The model exists but no version is ready to serve yet, or the server is draining."""


class ResourceExhaustedError(TfshipError):
    """A queue or limit is full (batch queue, concurrency or message size)."""


class DeadlineExceededError(TfshipError):
    """The request's deadline passed before it was served."""


class UnauthenticatedError(TfshipError):
    """The request carries no valid bearer token."""


class RequestTimeoutError(TfshipError):
    """The client did not send its whole request in time (a slow or stalled REST body): HTTP 408."""


class PermissionDeniedError(TfshipError):
    """The caller is authenticated but may not make this call (e.g. an admin call with an inference token)."""


class UnimplementedError(TfshipError):
    """The method exists in TF Serving's API but this model has no signature for it."""


class ModelError(TfshipError):
    """The model failed while running with a status of its own (TensorFlow's NotFoundError, OutOfRangeError,
    FailedPreconditionError, ResourceExhaustedError, PermissionDeniedError, ...): answered with that gRPC code and
    its HTTP status, as TF Serving passes the session's status on. `code` is the gRPC code's name; a name outside
    the table (or `OK`) answers UNKNOWN.
    """

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.status = ErrorStatus(code if code in HTTP_STATUS_OF_GRPC_CODE and code != "OK" else "UNKNOWN")


# gRPC code names by number; TensorFlow's `error_code`s are the same numbers (tensorflow/core/protobuf/error_codes).
GRPC_CODE_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                   "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
                   "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")

# TF Serving's REST status for each gRPC code (http_server.cc `ToHTTPStatusCode`).
HTTP_STATUS_OF_GRPC_CODE: dict[str, int] = {
    "OK": 200, "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400, "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "PERMISSION_DENIED": 403, "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400, "ABORTED": 409, "OUT_OF_RANGE": 400, "UNIMPLEMENTED": 501, "INTERNAL": 500,
    "UNAVAILABLE": 503, "DATA_LOSS": 500, "UNAUTHENTICATED": 401,
}

CLI_EXIT_CODE = 2
"""Exit status of every tfship CLI that stops on a TfshipError (the run stopped on a known cause)."""


@dataclass(frozen=True)
class ErrorStatus:
    """How one error kind is answered on each surface.

    Attributes:
        grpc_code: `grpc.StatusCode` member name.
        exit_code: CLI exit status.
    """

    grpc_code: str
    exit_code: int = CLI_EXIT_CODE
    http: int | None = None  # an HTTP status of its own, where TF Serving's mapping has no fitting one

    @property
    def http_status(self) -> int:
        """HTTP status code: `http` when set, else TF Serving's REST mapping of `grpc_code`."""
        return self.http or HTTP_STATUS_OF_GRPC_CODE[self.grpc_code]


# The one table. Lookup walks the class's MRO, so a subclass defined elsewhere (e.g. the runtimes'
# load error, a FailedPreconditionError) answers like its nearest listed base.
STATUS_TABLE: dict[type[TfshipError], ErrorStatus] = {
    TfshipError: ErrorStatus("INTERNAL"),
    ConfigError: ErrorStatus("INVALID_ARGUMENT"),
    DatasetError: ErrorStatus("INVALID_ARGUMENT"),
    InvalidRequestError: ErrorStatus("INVALID_ARGUMENT"),
    ModelNotFoundError: ErrorStatus("NOT_FOUND"),
    FailedPreconditionError: ErrorStatus("FAILED_PRECONDITION"),
    UnavailableError: ErrorStatus("UNAVAILABLE"),
    ResourceExhaustedError: ErrorStatus("RESOURCE_EXHAUSTED"),
    DeadlineExceededError: ErrorStatus("DEADLINE_EXCEEDED"),
    UnauthenticatedError: ErrorStatus("UNAUTHENTICATED"),
    PermissionDeniedError: ErrorStatus("PERMISSION_DENIED"),
    RequestTimeoutError: ErrorStatus("DEADLINE_EXCEEDED", http=408),  # the client was slow, not the server
    UnimplementedError: ErrorStatus("UNIMPLEMENTED"),
    ModelError: ErrorStatus("UNKNOWN"),  # each instance carries the model's own code (`ModelError.status`)
}


def status_of(error: TfshipError | type[TfshipError]) -> ErrorStatus:
    """The `ErrorStatus` of an error (instance or class): the entry of its nearest base in `STATUS_TABLE`.

    An instance may carry its own status (`RemoteError` repeats a remote server's code) through a
    `status` attribute; otherwise the table decides.
    """
    status = None if isinstance(error, type) else getattr(error, "status", None)
    if isinstance(status, ErrorStatus):
        return status
    kind = error if isinstance(error, type) else type(error)
    for base in kind.__mro__:
        if base in STATUS_TABLE:
            return STATUS_TABLE[base]
    raise TypeError(f"{kind.__name__} is not a TfshipError")


def cli_error(prog: str, error: TfshipError) -> tuple[str, int]:
    """The one way a tfship command line reports a `TfshipError`: `<prog>: <Kind>: <message>` and its exit status.

    Args:
        prog: the command as the user typed it, e.g. `tfship run` or `python -m tfship.serving serve`.
        error: the error that stopped the command.

    Returns:
        (the line for stderr, the exit status from `STATUS_TABLE`).
    """
    return f"{prog}: {type(error).__name__}: {error}", error.exit_code


_TENSORFLOW_NOISE = ("Graph execution error", "Detected at node", "<stack traces unavailable>", "[[")


def tensorflow_failure(message: str, limit: int = 500) -> str:
    """One line from a TensorFlow runtime error's text (`tf.errors.OpError.message`): its cause and the node.

    TensorFlow's text opens with "Graph execution error:" and "Detected at node …" lines and ends with
    `[[{{node X}}]]` frames; this keeps the first line that says what failed, then `(node X)`, at most
    `limit` characters. Example: "Fused conv implementation does not support grouped convolutions for now.
    (node model/depthwise_conv/BiasAdd)".
    """
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    cause = next((line for line in lines if not line.startswith(_TENSORFLOW_NOISE)), lines[0] if lines else "")
    node = next((line.split("{{node ", 1)[1].split("}}", 1)[0] for line in lines if "{{node " in line), "")
    if not node:
        node = next((line.split("Detected at node ", 1)[1].split(" defined at", 1)[0] for line in lines
                     if line.startswith("Detected at node ")), "")
    return (cause + (f" (node {node})" if node else ""))[:limit]

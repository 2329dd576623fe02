"""gRPC call plumbing shared by both gRPC APIs (TF Serving's and the Open Inference Protocol's).

`rpc` is the one place errors become statuses: a `TfshipError` aborts with its `grpc_code` and message (capped at
`core.echo.MESSAGE_BYTES`);
anything else aborts INTERNAL with a generic message, detail logged. `generic_handler` registers a servicer's
methods by full method name (no TensorFlow-generated stubs) with a deserializer that refuses undecodable
(INVALID_ARGUMENT) and oversized (RESOURCE_EXHAUSTED) requests and marks those above `OFF_LOOP_BYTES`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, overload

import grpc
from google.protobuf.message import DecodeError

from tfship.core.echo import cap_message, clip
from tfship.core.errors import InvalidRequestError, ResourceExhaustedError, TfshipError
from tfship.serving.dataplane.offload import OFF_LOOP_BYTES

log = logging.getLogger(__name__)


_Handler = Callable[..., Awaitable[Any]]  # a servicer's `async def Method(self, request, context)`


@overload
def rpc(method: _Handler, *, large: bool = False) -> _Handler: ...
@overload
def rpc(method: None = None, *, large: bool = False) -> Callable[[_Handler], _Handler]: ...
def rpc(method: _Handler | None = None, *, large: bool = False) -> _Handler | Callable[[_Handler], _Handler]:
    """Map exceptions raised by `method` to gRPC statuses (the single error-mapping point).

    Requests above `OFF_LOOP_BYTES` arrive from the deserializer as `LargeRequest`; `method` gets the bare message,
    or, with `@rpc(large=True)`, the `LargeRequest` itself (see `split_large`) to decode it in the helper process.
    """
    if method is None:
        return functools.partial(rpc, large=large)

    @functools.wraps(method)
    async def wrapper(self, request, context: grpc.aio.ServicerContext):
        dataplane = getattr(self, "_dp", None)  # servicers hold their DataPlane as `_dp`
        gate = getattr(dataplane, "gate", None)
        entered, status = False, "OK"
        failure: tuple[grpc.StatusCode, str] | None = None
        size = len(request.data) if type(request) is LargeRequest else 0
        message = request.message if size else request
        request_log = getattr(dataplane, "request_log", None)
        logged = (_start_request_log(request_log, method.__name__, message, context)
                  if request_log is not None and request_log.sampling_rate > 0.0 else None)
        try:
            if gate is not None:
                gate.enter()  # UNAVAILABLE while draining
                entered = True
            if type(request) in _REFUSED:
                _refuse(request)
            return await method(self, request if large else message, context)
        except TfshipError as err:
            status = err.grpc_code
            failure = (grpc.StatusCode[err.grpc_code], cap_message(str(err)))  # never past gRPC's limit
        except asyncio.CancelledError:  # the client went away: the request log says so, gRPC ends the call
            status = "CANCELLED"
            raise
        except Exception:
            status = "INTERNAL"
            incident = uuid.uuid4().hex[:12]
            log.exception("unexpected error in %s (incident %s)", method.__name__, incident)
            failure = (grpc.StatusCode.INTERNAL, f"internal server error (incident {incident})")
        finally:
            if entered and gate is not None:
                gate.leave()
            if logged is not None and request_log is not None:
                request_log.finish(logged, status)
            if failure is None and size and dataplane is not None and hasattr(dataplane, "release_after"):
                dataplane.release_after(size)  # a large message's heap goes back to the OS
        # Aborted outside the handlers, with the request dropped first: an abort raised inside `except` chains
        # the error, its traceback and every frame holding the request to the AbortError, which gRPC keeps in a
        # reference cycle; four refused 64 MB requests then held 1.2 GB until the garbage collector ran.
        request = message = None
        if size and dataplane is not None and hasattr(dataplane, "release_after"):
            dataplane.release_after(size)  # a large message's heap goes back to the OS
        assert failure is not None  # reached from an `except` only: the `try` returns the response
        await context.abort(*failure)

    return wrapper


def _refuse(request) -> None:
    """Raise the error of a request the deserializer could not hand over (`Undecodable`, `TooLarge`)."""
    if isinstance(request, Undecodable):
        raise InvalidRequestError(f"request is not a valid {request.type_name} message: {clip(str(request.error))}")
    raise ResourceExhaustedError(f"request of {request.size} bytes exceeds --max-message-bytes {request.limit} bytes")


def _start_request_log(request_log, method: str, request, context):
    """Open this call's request-log record (the server logs requests; this one may be sampled)."""
    spec = getattr(request, "model_spec", None)
    model = spec.name if spec is not None else getattr(request, "model_name", "") or getattr(request, "name", "")
    return request_log.start("grpc", method, context.peer() or "", model if isinstance(model, str) else "")


def time_remaining(context) -> float | None:
    """Seconds left before the client's deadline, or None when the call has none."""
    remaining = context.time_remaining()
    return None if remaining is None or remaining > 1e9 else remaining


class Undecodable:
    """A request body that did not parse; `rpc` answers it INVALID_ARGUMENT (grpc's own answer is UNKNOWN)."""

    def __init__(self, type_name: str, error: DecodeError) -> None:
        self.type_name, self.error = type_name, error


class LargeRequest:
    """A request above `OFF_LOOP_BYTES` on the wire: the parsed message and its bytes, which `Predict` and
    `ModelInfer` hand to the helper process when its tensors are typed values (smaller requests arrive as the
    bare message, so the common path never asks a message for its size).
    """

    __slots__ = ("data", "message")

    def __init__(self, data: bytes, message) -> None:
        self.data, self.message = data, message


def split_large(request) -> tuple:
    """(message, its wire bytes when above `OFF_LOOP_BYTES`, else None) of an `@rpc(large=True)` request."""
    return (request.message, request.data) if type(request) is LargeRequest else (request, None)


class TooLarge:
    """A request above --max-message-bytes; `rpc` answers RESOURCE_EXHAUSTED naming the flag and both sizes."""

    def __init__(self, size: int, limit: int) -> None:
        self.size, self.limit = size, limit


_REFUSED = (Undecodable, TooLarge)


def _deserializer(request_cls, max_bytes: int):
    parse = request_cls.FromString
    type_name = request_cls.DESCRIPTOR.full_name

    def deserialize(data: bytes):
        if len(data) > max_bytes:
            return TooLarge(len(data), max_bytes)
        try:
            message = parse(data)
        except DecodeError as err:
            return Undecodable(type_name, err)
        return LargeRequest(data, message) if len(data) > OFF_LOOP_BYTES else message

    return deserialize


def _serialize(message) -> bytes:
    """A handler's answer on the wire: a message serialised, or bytes a handler serialised itself (Predict, which
    measures its answer against --max-message-bytes) as they are.
    """
    return message if type(message) is bytes else message.SerializeToString()


def generic_handler(service: str, servicer, methods: dict[str, tuple[type, type]],
             max_bytes: int | None = None) -> grpc.GenericRpcHandler:
    """Generic handler of `servicer`'s methods; requests above `max_bytes` (default: the servicer's data plane
    limit, --max-message-bytes) reach `rpc` as `TooLarge`.
    """
    limit: int = servicer._dp.limits.max_tensor_bytes if max_bytes is None else max_bytes
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name),
            request_deserializer=_deserializer(request_cls, limit),
            response_serializer=_serialize,
        )
        for name, (request_cls, _response_cls) in methods.items()
    }
    return grpc.method_handlers_generic_handler(service, handlers)

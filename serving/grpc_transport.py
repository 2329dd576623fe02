"""gRPC transport: TF Serving's PredictionService and ModelService, health and reflection.

Servicer methods only convert protobuf <-> `serving.types` and call one data-plane method. The
`_rpc` decorator is the one place errors become statuses: a `TfshipError` aborts with its
`grpc_code` and message; anything else aborts INTERNAL with a generic message, detail logged.
Handlers are registered generically by full method name, so no TensorFlow-generated stubs are needed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid

import grpc
from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from tfship.core import protocol
from tfship.core.errors import InvalidRequestError, ResourceExhaustedError, TfshipError
from tfship.serving import converters
from tfship.serving.dataplane import DataPlane
from tfship.serving.model_config import from_proto
from tfship.serving.offload import OFF_LOOP_BYTES
from tfship.serving.security import AccessPolicy

log = logging.getLogger(__name__)


def _rpc(method=None, *, large: bool = False):
    """Map exceptions raised by `method` to gRPC statuses (the single error-mapping point).

    Requests above `OFF_LOOP_BYTES` arrive from the deserializer as `_Large`; `method` gets the bare message,
    or, with `@_rpc(large=True)`, the `_Large` itself (see `_wire`) to decode it in the helper process.
    """
    if method is None:
        return functools.partial(_rpc, large=large)

    @functools.wraps(method)
    async def wrapper(self, request, context: grpc.aio.ServicerContext):
        dataplane = getattr(self, "_dp", None)  # servicers hold their DataPlane as `_dp`
        gate = getattr(dataplane, "gate", None)
        entered, status = False, "OK"
        message = request.message if type(request) is _Large else request
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
            await context.abort(grpc.StatusCode[err.grpc_code], str(err))
        except Exception:
            status = "INTERNAL"
            incident = uuid.uuid4().hex[:12]
            log.exception("unexpected error in %s (incident %s)", method.__name__, incident)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal server error (incident {incident})")
        finally:
            if entered:
                gate.leave()
            if logged is not None:
                dataplane.request_log.finish(logged, status)

    return wrapper


def _refuse(request) -> None:
    """Raise the error of a request the deserializer could not hand over (`_Undecodable`, `_TooLarge`)."""
    if isinstance(request, _Undecodable):
        raise InvalidRequestError(f"request is not a valid {request.type_name} message: {request.error}")
    raise ResourceExhaustedError(f"request of {request.size} bytes exceeds --max-message-bytes {request.limit} bytes")


def _start_request_log(request_log, method: str, request, context):
    """Open this call's request-log record (the server logs requests; this one may be sampled)."""
    spec = getattr(request, "model_spec", None)
    model = spec.name if spec is not None else getattr(request, "model_name", "") or getattr(request, "name", "")
    return request_log.start("grpc", method, context.peer() or "", model if isinstance(model, str) else "")


def _time_remaining(context) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None or remaining > 1e9 else remaining


def decode_predict(data: bytes, time_remaining: float | None, max_tensor_bytes: int):
    """Serialized `PredictRequest` -> `InferenceRequest` (in the helper process, `serving.offload`)."""
    return converters.predict_request(protocol.PredictRequest.FromString(data), time_remaining, max_tensor_bytes)


class PredictionServicer:
    """`tensorflow.serving.PredictionService` over a `DataPlane`."""

    def __init__(self, dataplane: DataPlane) -> None:
        self._dp = dataplane

    @_rpc(large=True)
    async def Predict(self, request, context):
        limit = self._dp.limits.max_tensor_bytes
        request, wire = _wire(request)
        if wire is not None and any(not t.tensor_content for t in request.inputs.values()):
            # typed *_val fields: decoding is one long GIL-holding call, so it runs in the helper process
            inference = await self._dp.offloader.run_if_large(len(wire), decode_predict, wire,
                                                              _time_remaining(context), limit)
        else:  # small, or tensor_content (a view on the received bytes): nothing to offload
            inference = converters.predict_request(request, _time_remaining(context), limit)
        response = await self._dp.predict(inference)
        if sum(a.nbytes for a in response.outputs.values()) > OFF_LOOP_BYTES:
            proto = await asyncio.to_thread(converters.predict_response, response)
        else:
            proto = converters.predict_response(response)
        size = proto.ByteSize()  # computed, not serialised: an oversized answer never reaches gRPC's send
        if size > limit:
            raise ResourceExhaustedError(f"response of {size} bytes exceeds --max-message-bytes {limit} bytes; ask "
                                         "for fewer rows or fewer outputs (output_filter)")
        return proto

    @_rpc
    async def GetModelMetadata(self, request, context):
        return converters.metadata_response(await self._dp.metadata(converters.metadata_request(request)))

    @_rpc
    async def Classify(self, request, context):
        await self._dp.unimplemented("Classify", *_spec_of(request))

    @_rpc
    async def Regress(self, request, context):
        await self._dp.unimplemented("Regress", *_spec_of(request))

    @_rpc
    async def MultiInference(self, request, context):
        await self._dp.unimplemented("MultiInference")


def _spec_of(request) -> tuple:
    """(ModelRef or None when no model is named, signature_name) of a Classify/Regress request."""
    spec = request.model_spec
    return (converters.model_ref(spec) if spec.name else None), spec.signature_name


class ModelServicer:
    """`tensorflow.serving.ModelService`: GetModelStatus and HandleReloadConfigRequest."""

    def __init__(self, dataplane: DataPlane) -> None:
        self._dp = dataplane

    @_rpc
    async def GetModelStatus(self, request, context):
        statuses = await self._dp.model_status(converters.model_ref(request.model_spec))
        return converters.status_response(statuses)

    @_rpc
    async def HandleReloadConfigRequest(self, request, context):
        await self._dp.reload_config(from_proto(request.config, "ReloadConfigRequest.config"))
        response = protocol.ReloadConfigResponse()
        response.status.error_code = 0
        return response


class _Undecodable:
    """A request body that did not parse; `_rpc` answers it INVALID_ARGUMENT (grpc's own answer is UNKNOWN)."""

    def __init__(self, type_name: str, error: DecodeError) -> None:
        self.type_name, self.error = type_name, error


class _Large:
    """A request above `OFF_LOOP_BYTES` on the wire: the parsed message and its bytes, which `Predict` and
    `ModelInfer` hand to the helper process when its tensors are typed values (smaller requests arrive as the
    bare message, so the common path never asks a message for its size).
    """

    __slots__ = ("data", "message")

    def __init__(self, data: bytes, message) -> None:
        self.data, self.message = data, message


def _wire(request) -> tuple:
    """(message, its wire bytes when above `OFF_LOOP_BYTES`, else None) of an `@_rpc(large=True)` request."""
    return (request.message, request.data) if type(request) is _Large else (request, None)


class _TooLarge:
    """A request above --max-message-bytes; `_rpc` answers RESOURCE_EXHAUSTED naming the flag and both sizes."""

    def __init__(self, size: int, limit: int) -> None:
        self.size, self.limit = size, limit


_REFUSED = (_Undecodable, _TooLarge)


def _deserializer(request_cls, max_bytes: int):
    parse = request_cls.FromString
    type_name = request_cls.DESCRIPTOR.full_name

    def deserialize(data: bytes):
        if len(data) > max_bytes:
            return _TooLarge(len(data), max_bytes)
        try:
            message = parse(data)
        except DecodeError as err:
            return _Undecodable(type_name, err)
        return _Large(data, message) if len(data) > OFF_LOOP_BYTES else message

    return deserialize


def _handler(service: str, servicer, methods: dict[str, tuple[type, type]],
             max_bytes: int | None = None) -> grpc.GenericRpcHandler:
    """Generic handler of `servicer`'s methods; requests above `max_bytes` (default: the servicer's data plane
    limit, --max-message-bytes) reach `_rpc` as `_TooLarge`.
    """
    if max_bytes is None:
        max_bytes = servicer._dp.limits.max_tensor_bytes
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name),
            request_deserializer=_deserializer(request_cls, max_bytes),
            response_serializer=lambda message: message.SerializeToString(),
        )
        for name, (request_cls, _response_cls) in methods.items()
    }
    return grpc.method_handlers_generic_handler(service, handlers)


class AccessInterceptor(grpc.aio.ServerInterceptor):
    """Apply the server's `AccessPolicy` to every call (UNAUTHENTICATED / PERMISSION_DENIED).

    Admin methods (`ADMIN_METHODS`) need the admin right; every other method the inference right. Health
    checks and reflection stay open, as load balancers and tools probe them without credentials.
    """

    OPEN = ("/grpc.health.v1.Health/", "/grpc.reflection.")
    ADMIN_METHODS = frozenset({protocol.method_path(protocol.MODEL_SERVICE, "HandleReloadConfigRequest")})

    def __init__(self, policy: AccessPolicy) -> None:
        self._policy = policy

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        admin = method in self.ADMIN_METHODS
        if (not admin and not self._policy.requires_token) or method.startswith(self.OPEN):
            return await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        try:
            self._policy.check(metadata.get("authorization", ""), admin=admin)
        except TfshipError as error:
            code, message = grpc.StatusCode[error.grpc_code], str(error)

            async def deny(request, context):
                await context.abort(code, message)

            return grpc.unary_unary_rpc_method_handler(deny)
        return await continuation(handler_call_details)


class HealthServicer(health.aio.HealthServicer):
    """grpc.health.v1 whose NOT_FOUND for an unknown service names it and the known ones."""

    def __init__(self) -> None:
        super().__init__()
        self._known: set[str] = set()

    async def set(self, service: str, status) -> None:
        self._known.add(service)
        await super().set(service, status)

    async def Check(self, request, context):
        if request.service not in self._known:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown health service {request.service!r}; known: "
                                f"{sorted(self._known)} ('' is the whole server, a model name one model)")
        return await super().Check(request, context)


def add_services(server: grpc.aio.Server, dataplane: DataPlane,
                 other_services: tuple[str, ...] = ()) -> health.aio.HealthServicer:
    """Register PredictionService, ModelService, grpc.health.v1 and reflection on `server`.

    Requests above the data plane's message limit (--max-message-bytes) are answered RESOURCE_EXHAUSTED
    naming the flag and the sizes (the server lets gRPC itself take up to twice that, see `server.py`).

    `other_services`: names of services already registered (e.g. `inference.GRPCInferenceService`) that
    reflection lists too. Returns the health servicer; "" and each model name start NOT_SERVING.
    """
    server.add_generic_rpc_handlers((
        _handler(protocol.PREDICTION_SERVICE, PredictionServicer(dataplane), protocol.PREDICTION_METHODS),
        _handler(protocol.MODEL_SERVICE, ModelServicer(dataplane), protocol.MODEL_METHODS),
    ))
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (protocol.PREDICTION_SERVICE, protocol.MODEL_SERVICE, *other_services,
             health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    _add_to_pool(health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR)
    reflection.enable_server_reflection(names, server, pool=protocol.POOL)
    return health_servicer



def _add_to_pool(*file_descriptors) -> None:
    """Make health/reflection protos discoverable through reflection on tfship's private pool."""
    for fd in file_descriptors:
        try:
            protocol.POOL.FindFileByName(fd.name)
        except KeyError:
            proto = descriptor_pb2.FileDescriptorProto()
            fd.CopyToProto(proto)
            protocol.POOL.Add(proto)

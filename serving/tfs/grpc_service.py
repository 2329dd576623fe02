"""gRPC transport: TF Serving's PredictionService and ModelService, health and reflection.

Servicer methods only convert protobuf <-> `serving.dataplane.types` and call one data-plane method. The
`rpc` decorator is the one place errors become statuses: a `TfshipError` aborts with its
`grpc_code` and message; anything else aborts INTERNAL with a generic message, detail logged.
Handlers are registered generically by full method name, so no TensorFlow-generated stubs are needed.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from tfship.core import protocol
from tfship.core.contract import DEFAULT_SIGNATURE
from tfship.core.echo import echo
from tfship.core.errors import ResourceExhaustedError, TfshipError
from tfship.serving.dataplane.admission import check_declared
from tfship.serving.dataplane.contract import check_input_names
from tfship.serving.dataplane.model_config import from_proto
from tfship.serving.dataplane.offload import OFF_LOOP_BYTES
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.tensors import judge_declared
from tfship.serving.dataplane.types import InferenceRequest, ModelMetadata
from tfship.serving.grpc_calls import LargeRequest, generic_handler, rpc, split_large, time_remaining
from tfship.serving.operations.security import Policy
from tfship.serving.tfs import converters, examples, wire
from tfship.serving.tfs.predict_plans import PredictPlans

log = logging.getLogger(__name__)


def decode_predict(data: bytes, time_remaining: float | None, max_tensor_bytes: int):
    """Serialized `PredictRequest` -> `InferenceRequest` (in the helper process, `serving.dataplane.offload`);
    its declared total was judged before it was handed over (`PredictionServicer._decoder`).
    """
    return converters.predict_request(protocol.PredictRequest.FromString(data), time_remaining, max_tensor_bytes)


class PredictionServicer:
    """`tensorflow.serving.PredictionService` over a `DataPlane`."""

    def __init__(self, dataplane: DataPlane, tensor_content: bool = False) -> None:
        self._dp = dataplane
        self._tensor_content = tensor_content  # --enable_serialization_as_tensor_content (converters)
        self._plans = PredictPlans(dataplane)

    @rpc(large=True)
    async def Predict(self, request, context):
        limit = self._dp.limits.max_tensor_bytes
        # a layout judged before on the held version (`predict_plans`); else, or None, the general path
        response = None if type(request) is LargeRequest else await self._plans.predict(request,
                                                                                          time_remaining(context))
        if response is None:
            request, wire_bytes = split_large(request)
            model = converters.model_ref(request.model_spec)
            response = await self._dp.predict_decoded(model, self._decoder(request, model, wire_bytes, context))
        if sum(a.nbytes for a in response.outputs.values()) > OFF_LOOP_BYTES:
            data = await asyncio.to_thread(wire.predict_response_bytes, response, self._tensor_content)
        else:
            data = wire.predict_response_bytes(response, self._tensor_content)
        size = len(data)  # serialised once (upb's ByteSize() serialises too); gRPC sends these bytes as they are
        if size > limit:
            raise ResourceExhaustedError(f"response of {size} bytes exceeds --max-message-bytes {limit} bytes; ask "
                                         "for fewer rows or fewer outputs (output_filter)")
        return data

    def _decoder(self, request, model, wire_bytes: bytes | None, context):
        """`predict_decoded`'s decoder of a Predict: judged on its declared shapes against the held version's
        signature first (`serving.dataplane.admission`: a batch or size above the limits is refused before anything
        is copied or filled: one `float_val` fills a whole declared shape), then decoded inline, or, when large
        (`wire_bytes`) with typed `*_val` fields, in the helper process (one long GIL-holding call).
        `tensor_content` needs no offloading: it is a view on the received bytes.
        """
        limits, remaining = self._dp.limits, time_remaining(context)
        signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        offload = wire_bytes is not None and any(not t.tensor_content for t in request.inputs.values())

        async def decode(meta: ModelMetadata | None) -> InferenceRequest | None:
            if meta is None and offload:  # the lookup's error is the answer
                return None
            signature = None if meta is None else meta.signatures.get(signature_name)
            if signature is not None:  # names first, as TF Serving: nothing decoded for a request that is refused
                check_input_names(signature, request.inputs)
            declared, judged, shapes = 0, [], {}  # the protobuf map walked once, each input's shape read once
            for name, tensor in request.inputs.items():
                size, dims = judge_declared(tensor, name, limits.max_tensor_bytes)  # each input's own bounds
                declared += size
                judged.append((name, tensor, dims))
                shapes[name] = dims
            if meta is not None:
                check_declared(signature, shapes, limits.max_batch_per_request,
                               limits.max_request_memory_bytes)
            converters.check_declared_total(request, declared, limits.max_request_memory_bytes)  # unknown ones too
            if offload and wire_bytes is not None:  # offload: large wire bytes
                return await self._dp.offloader.run_if_large(len(wire_bytes), decode_predict, wire_bytes, remaining,
                                                             limits.max_tensor_bytes)
            decoded = converters.judged_predict_request(request, model, judged, remaining)  # judged above
            return decoded if meta is not None else None

        return decode

    @rpc
    async def GetModelMetadata(self, request, context):
        meta = await self._dp.metadata(converters.metadata_request(request))
        return converters.metadata_response(meta, tuple(request.metadata_field))

    @rpc
    async def Classify(self, request, context):
        inference = examples.classification_request(request, time_remaining(context))
        return examples.classification_response(await self._dp.infer_examples(inference))

    @rpc
    async def Regress(self, request, context):
        inference = examples.regression_request(request, time_remaining(context))
        return examples.regression_response(await self._dp.infer_examples(inference))

    @rpc
    async def MultiInference(self, request, context):
        inference = examples.multi_inference_request(request, time_remaining(context))
        return examples.multi_inference_response(await self._dp.infer_examples(inference))


class ModelServicer:
    """`tensorflow.serving.ModelService`: GetModelStatus and HandleReloadConfigRequest."""

    def __init__(self, dataplane: DataPlane) -> None:
        self._dp = dataplane

    @rpc
    async def GetModelStatus(self, request, context):
        statuses = await self._dp.model_status(converters.model_ref(request.model_spec))
        return converters.status_response(statuses)

    @rpc
    async def HandleReloadConfigRequest(self, request, context):
        await self._dp.reload_config(from_proto(request.config, "ReloadConfigRequest.config"))
        response = protocol.ReloadConfigResponse()
        response.status.error_code = 0
        return response


class AccessInterceptor(grpc.aio.ServerInterceptor):
    """Apply the server's `AccessPolicy` to every call (UNAUTHENTICATED / PERMISSION_DENIED).

    Admin methods (`ADMIN_METHODS`) need the admin right; every other method the inference right. Health
    checks and reflection stay open, as load balancers and tools probe them without credentials.
    """

    OPEN = ("/grpc.health.v1.Health/", "/grpc.reflection.")
    ADMIN_METHODS = frozenset({protocol.method_path(protocol.MODEL_SERVICE, "HandleReloadConfigRequest")})

    def __init__(self, policy: Policy) -> None:
        self._policy = policy

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        admin = method in self.ADMIN_METHODS
        if (not admin and not self._policy.requires_token) or method.startswith(self.OPEN):
            return await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        try:
            authorization = metadata.get("authorization", "")  # bytes only for `-bin` keys
            self._policy.check(authorization if isinstance(authorization, str) else "", admin=admin)
        except TfshipError as error:
            code, message = grpc.StatusCode[error.grpc_code], str(error)

            async def deny(request, context):
                await context.abort(code, message)

            return grpc.unary_unary_rpc_method_handler(deny)
        return await continuation(handler_call_details)


class HealthServicer(health.aio.HealthServicer):  # pyright: ignore[reportAttributeAccessIssue]  # typeshed's grpc_health stub lacks `aio`
    """grpc.health.v1 whose NOT_FOUND for an unknown service names it and the known ones."""

    def __init__(self) -> None:
        super().__init__()
        self._known: set[str] = set()

    async def set(self, service: str, status) -> None:
        self._known.add(service)
        await super().set(service, status)

    async def Check(self, request, context):
        if request.service not in self._known:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown health service {echo(request.service)}; known: "
                                f"{sorted(self._known)} ('' is the whole server, a model name one model)")
        return await super().Check(request, context)


def add_services(server: grpc.aio.Server, dataplane: DataPlane, other_services: tuple[str, ...] = (),
                 tensor_content: bool = False) -> HealthServicer:
    """Register PredictionService, ModelService, grpc.health.v1 and reflection on `server`.

    Requests above the data plane's message limit (--max-message-bytes) are answered RESOURCE_EXHAUSTED
    naming the flag and the sizes (the server lets gRPC itself take up to twice that, see `server.py`).

    `other_services`: names of services already registered (e.g. `inference.GRPCInferenceService`) that
    reflection lists too. `tensor_content`: Predict answers in `tensor_content` instead of the typed fields
    (--enable_serialization_as_tensor_content). Returns the health servicer; "" and each model name start
    NOT_SERVING.
    """
    predict = PredictionServicer(dataplane, tensor_content)
    server.add_generic_rpc_handlers((
        generic_handler(protocol.PREDICTION_SERVICE, predict, protocol.PREDICTION_METHODS),
        generic_handler(protocol.MODEL_SERVICE, ModelServicer(dataplane), protocol.MODEL_METHODS),
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

"""gRPC transport for the Open Inference Protocol: `inference.GRPCInferenceService` (KServe V2 / Triton).

Registered on the same `grpc.aio` server as TF Serving's API, so the same port, TLS, bearer-token
interceptor, message-size limits and error mapping (`serving.grpc_calls.rpc`) apply. `ModelInfer` decodes
the tensors, checks them against the signature and calls `DataPlane.predict`, exactly like Predict.

Response encoding: `raw_output_contents` (as Triton answers, and what tritonclient reads) unless the
request sent typed `contents` for its inputs, in which case typed `contents` come back; a request or
output parameter `binary_data_output` / `binary_data` (bool) decides explicitly. FP16 outputs have no
typed field, so a response holding one is always raw.
"""

from __future__ import annotations

import asyncio

import grpc

from tfship.core import kserve_protocol as kp
from tfship.core.echo import echo
from tfship.core.errors import InvalidRequestError
from tfship.serving.dataplane.admission import check_declared
from tfship.serving.dataplane.contract import check_input_names
from tfship.serving.dataplane.offload import OFF_LOOP_BYTES
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.types import InferenceRequest, ModelMetadata, ModelRef
from tfship.serving.grpc_calls import generic_handler, rpc, split_large, time_remaining
from tfship.serving.kserve.codec import datatype_for, fill_contents, from_contents, from_raw, to_raw
from tfship.serving.kserve.converters import (
    EXTENSIONS,
    SERVER_NAME,
    check_inputs,
    check_outputs,
    check_response_size,
    infer_options,
    model_config,
    model_info,
    model_ref,
    ordered_outputs,
    predict_request,
    server_version,
    signature_of,
)


def parameters(proto_map) -> dict[str, object]:
    """A `map<string, InferParameter>` as plain Python values (an unset parameter is None)."""
    values = {}
    for key, param in proto_map.items():
        choice = param.WhichOneof("parameter_choice")
        values[key] = getattr(param, choice) if choice else None
    return values


class InferenceServicer:
    """`inference.GRPCInferenceService` over a `DataPlane` (one data-plane call per RPC)."""

    def __init__(self, dataplane: DataPlane) -> None:
        self._dp = dataplane

    @rpc
    async def ServerLive(self, request, context):
        return kp.ServerLiveResponse(live=True)

    @rpc
    async def ServerReady(self, request, context):
        return kp.ServerReadyResponse(ready=self._dp.server_ready())

    @rpc
    async def ModelReady(self, request, context):
        return kp.ModelReadyResponse(ready=self._dp.model_ready(model_ref(request.name, request.version)))

    @rpc
    async def ServerMetadata(self, request, context):
        return kp.ServerMetadataResponse(name=SERVER_NAME, version=server_version(), extensions=EXTENSIONS)

    @rpc
    async def ModelMetadata(self, request, context):
        ref = model_ref(request.name, request.version)
        meta = await self._dp.metadata(ref)
        info = model_info(meta, self._dp.available_versions(ModelRef(ref.name)))
        response = kp.ModelMetadataResponse(name=info.name, versions=info.versions, platform=info.platform)
        for tensors, field in ((info.inputs, response.inputs), (info.outputs, response.outputs)):
            for tensor in tensors:
                field.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        return response

    @rpc
    async def ModelConfig(self, request, context):
        meta = await self._dp.metadata(model_ref(request.name, request.version))
        info = model_config(meta, self._dp.limits.max_batch_per_request)
        response = kp.ModelConfigResponse()
        config = response.config
        config.name, config.platform, config.backend = info.name, info.platform, info.backend
        config.max_batch_size = info.max_batch_size
        for tensors, field in ((info.inputs, config.input), (info.outputs, config.output)):
            for tensor in tensors:
                field.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
        return response

    @rpc(large=True)
    async def ModelInfer(self, request, context):
        request, wire_bytes = split_large(request)
        params = parameters(request.parameters)
        options = infer_options(params, time_remaining(context))
        limit = self._dp.limits.max_tensor_bytes
        checked = {}  # the held version's signature and the outputs asked of it

        async def decode(meta: ModelMetadata | None) -> InferenceRequest | None:
            if meta is None:  # the lookup's error is the answer
                return None
            signature = signature_of(meta.signatures, options.signature_name)
            names = [t.name for t in request.inputs]
            if all(names) and len(set(names)) == len(names):  # else `check_inputs` names the fault
                check_input_names(signature, names)  # before any value is decoded, as the Predict decoder
            if wire_bytes is not None and _slow_to_decode(request):
                # converting typed contents, or splitting raw BYTES, is one long GIL-holding call, so it runs in the
                # helper process, once the declared shapes are within the limits (serving.dataplane.admission)
                check_declared(signature, {t.name: list(t.shape) for t in request.inputs},
                               self._dp.limits.max_batch_per_request, self._dp.limits.max_request_memory_bytes)
                decoded = await self._dp.offloader.run_if_large(len(wire_bytes), decode_infer_inputs, wire_bytes,
                                                                limit)
            else:  # small, or raw numbers (views on the received bytes): nothing to offload
                decoded = _decode_inputs(request, limit)
            inputs = check_inputs(signature, decoded)
            outputs = check_outputs(signature, [o.name for o in request.outputs])
            checked.update(signature=signature, outputs=outputs, explicit=_binary_choices(request))
            return predict_request(meta, options, inputs, outputs)

        # one version: decoded against and run on, however long the helper process takes
        result = await self._dp.predict_decoded(model_ref(request.model_name, request.model_version), decode)
        tensors, explicit = ordered_outputs(result, checked["signature"], checked["outputs"]), checked["explicit"]
        check_response_size(tensors, limit)
        raw = params.get("binary_data_output")
        if not isinstance(raw, bool):
            raw = any(explicit) if explicit else bool(request.raw_input_contents)
        if sum(a.nbytes for _name, a in tensors) > OFF_LOOP_BYTES:  # as Predict encodes its large answers
            return await asyncio.to_thread(_response, request, result, tensors, raw)
        return _response(request, result, tensors, raw)


def _slow_to_decode(request) -> bool:
    """Whether decoding `request`'s inputs is per-value Python work: typed `contents`, or raw BYTES (a loop over
    length-prefixed elements: 8 million empty strings in a 32 MB request held the gRPC loop for 5 s).
    """
    return not request.raw_input_contents or any(t.datatype == "BYTES" for t in request.inputs)


def decode_infer_inputs(data: bytes, max_bytes: int) -> list:
    """Inputs of a serialized `ModelInferRequest` (in the data plane's helper process, `serving.dataplane.offload`)."""
    return _decode_inputs(kp.ModelInferRequest.FromString(data), max_bytes)


def _decode_inputs(request, max_bytes: int) -> list:
    """(name, datatype, array) per input, from `raw_input_contents` or each input's typed `contents`."""
    raw = request.raw_input_contents
    if raw:
        if len(raw) != len(request.inputs):
            raise InvalidRequestError(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} "
                                      "inputs; send one per input, in the order of 'inputs'")
        typed = [t.name for t in request.inputs if t.HasField("contents")]
        if typed:
            raise InvalidRequestError(f"input {echo(typed[0])} sets contents while raw_input_contents is used; "
                                      "send every input one way")
        return [(t.name, t.datatype, from_raw(t.name, t.datatype, t.shape, data, max_bytes))
                for t, data in zip(request.inputs, raw)]
    return [(t.name, t.datatype, from_contents(t.name, t.datatype, t.shape, t.contents, max_bytes))
            for t in request.inputs]


def _binary_choices(request) -> list[bool]:
    """The requested outputs' `binary_data` parameters that were set; refuses the classification extension."""
    choices = []
    for output in request.outputs:
        params = parameters(output.parameters)
        if "classification" in params:
            raise InvalidRequestError(f"output {echo(output.name)}: the classification extension is not supported; "
                                      "request the output itself")
        if isinstance(params.get("binary_data"), bool):
            choices.append(params["binary_data"])
    return choices


def _response(request, result, tensors, raw: bool):
    response = kp.ModelInferResponse(model_name=result.model_name, model_version=str(result.version),
                                     id=request.id)
    datatypes = [datatype_for(array.dtype) for _name, array in tensors]
    raw = raw or "FP16" in datatypes  # FP16 has no typed field; the protocol forbids mixing the two forms
    for (name, array), datatype in zip(tensors, datatypes):
        tensor = response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        if raw:
            response.raw_output_contents.append(to_raw(array))
        else:
            fill_contents(tensor.contents, array)
    return response


def add_inference_service(server: grpc.aio.Server, dataplane: DataPlane) -> str:
    """Register `inference.GRPCInferenceService` on `server`; returns the service name (for reflection)."""
    server.add_generic_rpc_handlers((generic_handler(kp.SERVICE, InferenceServicer(dataplane), kp.METHODS),))
    return kp.SERVICE

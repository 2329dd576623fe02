"""Predict's planned path: a request whose layout this server judged before skips what its layout decides.

A `PredictRequest`'s layout is its model spec (name, version or label), its signature name and, for each input in
order, its alias, DataType, declared dims, `unknown_rank` flag and the count of its typed values. Every check the
general path makes before it runs the model (`PredictionServicer._decoder`, then `DataPlane.judge`) depends on the
layout and on the held version's signature alone: the input names, each input's declared bytes and dims, the declared
rows and memory, the contract (dtypes, ranks, fixed dims), the batch and memory limits. So the first request of a
layout goes through those checks in full, by the same functions, on the version it holds; when every one passes, the
layout and their results are remembered for that version's runtime. A later request of that layout on that runtime is
decoded (`tensors.decode_declared`: the same value checks, the same errors) and run (`DataPlane.predict_held`:
deadline, in-flight limit, the model call, the shadow, the answer's size, metrics).

Everything else takes the general path, which answers it exactly as before: a layout never seen, or one a check
refused (its error is never remembered); a version that cannot be held (its error comes from there, in TF Serving's
order); a request with an `output_filter`; requests above `OFF_LOOP_BYTES` (decoded in the helper process); typed
values whose count is neither 0, 1 nor the shape's; and every request of a server with request logging or tracing on
(their records and spans are made on the general path). At most `MAX_PLANS` layouts are kept (the memo is emptied
when full); a plan refers to its runtime (weakly) and its limits, so a new version never matches.

Why (issue 43): the general path's checks cost tfship's Predict handler about half of its CPU per request on the
identity backend (`python -m bench.serve.handler_cost`, results in bench/results/serve-profile.md).
"""

from __future__ import annotations

import math
import time
import weakref

from tfship.core import protocol
from tfship.core.contract import DEFAULT_SIGNATURE, Signature
from tfship.core.errors import TfshipError
from tfship.serving.dataplane.admission import check_declared
from tfship.serving.dataplane.contract import check_input_names
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.tensors import decode_declared, judge_declared
from tfship.serving.dataplane.types import InferenceRequest, InferenceResponse, ModelRef, ServerLimits
from tfship.serving.operations import tracing
from tfship.serving.runtimes.base import Rows
from tfship.serving.tfs import converters

MAX_PLANS = 1024
# DataType enum -> the TensorProto field its typed values travel in (`tensors`' table, keyed by number)
_VALUES = {protocol.DATA_TYPE.values_by_name[name].number: field
           for name, field in (("DT_FLOAT", "float_val"), ("DT_DOUBLE", "double_val"), ("DT_HALF", "half_val"),
                               ("DT_INT8", "int_val"), ("DT_INT16", "int_val"), ("DT_INT32", "int_val"),
                               ("DT_UINT8", "int_val"), ("DT_UINT16", "int_val"), ("DT_INT64", "int64_val"),
                               ("DT_UINT32", "uint32_val"), ("DT_UINT64", "uint64_val"), ("DT_BOOL", "bool_val"),
                               ("DT_COMPLEX64", "scomplex_val"), ("DT_COMPLEX128", "dcomplex_val"),
                               ("DT_STRING", "string_val"))}


class _Plan:
    """What the general path's checks found for one layout on one runtime (held weakly: a stale plan never keeps
    an unloaded version alive).
    """

    __slots__ = ("counted", "dims", "held", "limits", "ref", "runtime", "signature", "signature_name")

    def __init__(self, runtime, limits: ServerLimits, ref: ModelRef, signature_name: str, signature: Signature,
                 dims: list[list[int]], counted: Rows, held: int) -> None:
        self.runtime, self.limits, self.ref, self.signature_name = weakref.ref(runtime), limits, ref, signature_name
        self.signature, self.dims, self.counted, self.held = signature, dims, counted, held


def layout(request) -> tuple | None:
    """The layout key of a parsed `PredictRequest` (see the module docstring); None: not plannable (an
    `output_filter`, or an input whose DataType has no typed-values field here). Reads no value.
    """
    if request.output_filter:
        return None
    spec = request.model_spec
    choice = spec.WhichOneof("version_choice")
    version = None if choice is None else spec.version.value if choice == "version" else spec.version_label
    parts: list = [spec.name, choice, version, spec.signature_name]
    for name, tensor in request.inputs.items():
        field = _VALUES.get(tensor.dtype)
        if field is None:
            return None
        shape = tensor.tensor_shape
        parts.append((name, tensor.dtype, tuple([d.size for d in shape.dim]), shape.unknown_rank,
                      len(getattr(tensor, field))))
    return tuple(parts)


class PredictPlans:
    """The planned path of one `DataPlane`'s Predicts (TF Serving's gRPC API); see the module docstring."""

    def __init__(self, dataplane: DataPlane) -> None:
        self._dp = dataplane
        self._plans: dict[tuple, _Plan] = {}

    def _usable(self) -> bool:
        return self._dp.request_log.sampling_rate <= 0.0 and not tracing.enabled()

    async def predict(self, request, time_remaining: float | None) -> InferenceResponse | None:
        """The answer to a parsed `PredictRequest` (not a `LargeRequest`) on the planned path; None: take the
        general path (then nothing was held, run or recorded here).

        Raises:
            InvalidRequestError: an empty `model_spec.name` (`converters.model_ref`, as the general path), or
                values that do not decode (`tensors.decode_declared`). Otherwise as `DataPlane.predict`.
        """
        if not self._usable():
            return None
        key = layout(request)
        if key is None:
            return None
        dp = self._dp
        plan = self._plans.get(key)
        ref = converters.model_ref(request.model_spec) if plan is None else plan.ref
        try:
            served = dp.manager.hold(ref)
        except TfshipError:
            return None  # the general path answers it, after the body's own errors (TF Serving's order)
        deadline = None if time_remaining is None else time.monotonic() + time_remaining
        first: dict | None = None  # a layout learned now: its values were decoded by the checks, once
        if plan is None or plan.runtime() is not served.runtime or plan.limits is not dp.limits:
            try:
                learned = self._learn(key, request, ref, served)
            except BaseException:
                dp.manager.release(served)
                raise
            if learned is None:
                dp.manager.release(served)
                return None
            plan, first = learned
        known = plan

        def decoded() -> InferenceRequest:
            inputs = first if first is not None else {
                name: decode_declared(tensor, name, dims)
                for (name, tensor), dims in zip(request.inputs.items(), known.dims)}
            return InferenceRequest(known.ref, inputs, known.signature_name, deadline=deadline)

        return await dp.predict_held(served, known.ref.name, decoded, known.signature, known.counted, known.held)

    def _learn(self, key: tuple, request, ref: ModelRef, served) -> tuple[_Plan, dict] | None:
        """The general path's checks of this layout on `served` (held): (its plan, remembered, and the request's
        inputs the checks decoded) when all pass, else None (nothing remembered: the general path raises the error).
        A full memo is emptied first (bounded; a layout learned costs what the general path costs, plus its key).
        """
        dp = self._dp
        limits = dp.limits
        signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        signature = served.metadata(ref.name).signatures.get(signature_name)
        if signature is None:
            return None
        try:
            check_input_names(signature, request.inputs)
            declared, dims, shapes = 0, [], {}
            for name, tensor in request.inputs.items():
                size, tensor_dims = judge_declared(tensor, name, limits.max_tensor_bytes)
                listed = key[4 + len(dims)][4]
                if listed not in (0, 1, math.prod(tensor_dims)):  # counted only without tensor_content: not a layout
                    return None
                declared += size
                dims.append(tensor_dims)
                shapes[name] = tensor_dims
            check_declared(signature, shapes, limits.max_batch_per_request, limits.max_request_memory_bytes)
            converters.check_declared_total(request, declared, limits.max_request_memory_bytes)
            inputs = {name: decode_declared(tensor, name, d) for (name, tensor), d in zip(request.inputs.items(), dims)}
            judged, counted, held = dp.judge(InferenceRequest(ref, inputs, signature_name), served.version,
                                             served.runtime)
        except TfshipError:
            return None
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        plan = self._plans[key] = _Plan(served.runtime, limits, ref, signature_name, judged, dims, counted, held)
        return plan, inputs

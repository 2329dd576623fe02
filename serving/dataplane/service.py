"""The data plane: one method per RPC, shared by the gRPC and REST transports.

Lookup (via the model manager), validation against the signature contract, limits, deadlines and
metrics live here; transports only convert their wire format to `serving.dataplane.types` and back.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor

from tfship.core.contract import Signature
from tfship.core.echo import clip, echo, echo_list
from tfship.core.errors import (
    DeadlineExceededError,
    InvalidRequestError,
    ResourceExhaustedError,
    TfshipError,
    UnimplementedError,
)
from tfship.serving.dataplane import inference
from tfship.serving.dataplane.admission import memory_over_limit, rows_over_limit
from tfship.serving.dataplane.answer_checks import check_output_filter, check_response_size
from tfship.serving.dataplane.contract import RequestChecks, refault
from tfship.serving.dataplane.gate import RequestGate
from tfship.serving.dataplane.inference import ExamplesRequest, ExamplesResponse, TaskResult
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.memory import release_freed_memory
from tfship.serving.dataplane.model_config import ModelConfig
from tfship.serving.dataplane.offload import Offloader
from tfship.serving.dataplane.shadow import Shadows
from tfship.serving.dataplane.types import (
    InferenceRequest,
    InferenceResponse,
    ModelMetadata,
    ModelRef,
    ServerLimits,
    VersionState,
    VersionStatus,
)
from tfship.serving.operations import tracing
from tfship.serving.operations.metrics import Metrics
from tfship.serving.operations.request_log import UNKNOWN_MODEL_LABEL, RequestLog, note_request
from tfship.serving.runtimes.base import Rows

RELEASE_AFTER_BYTES = 16 << 20  # requests holding this much trigger a malloc_trim once answered


def request_status(err: BaseException) -> str:
    """The status label a request that raised `err` is counted under: a `TfshipError`'s gRPC code, CANCELLED for a
    call cancelled (the client went away, or its deadline cancelled it) or torn down, else INTERNAL.
    """
    if isinstance(err, TfshipError):
        return err.grpc_code
    return "INTERNAL" if isinstance(err, Exception) else "CANCELLED"


class DataPlane:
    """Serves Predict, GetModelMetadata, GetModelStatus and ReloadConfig on top of a `ModelManager`.

    Args:
        manager: resolves model references to loaded versions.
        executor: threads for the runtimes' blocking calls (`Runtime.predict_async` decides per call: measured
            cheap calls run on the event loop, the others on these threads; a batching runtime uses its own).
        limits: per-request limits (`ServerLimits`).
        metrics: Prometheus metrics to update.
        request_log: per-request structured lines (`serving.operations.request_log`); default off. Transports open and
            write the records; the data plane notes the version, signature and batch rows it resolved.

    The methods in `ANY_LOOP` may run on any transport's event loop at once (each transport serves its requests
    on its own thread, `serving.loops`): versions are held and released under the manager's lock, the in-flight
    count under its own, batching queues and metrics are thread-safe. Everything else runs on the loop that owns
    the manager.
    """

    ANY_LOOP = frozenset({"predict", "predict_decoded", "infer_examples"})

    def __init__(self, manager: ModelManager, executor: Executor, limits: ServerLimits, metrics: Metrics,
                 request_log: RequestLog | None = None) -> None:
        self.manager = manager
        self._executor = executor
        self._limits = limits
        self._metrics = metrics
        self._inflight = 0
        self._inflight_lock = threading.Lock()
        metrics.inflight.set_function(lambda: self._inflight)  # read at scrape time, not per request
        self.checks = RequestChecks()  # validation, rows and memory estimate by request layout
        self._releasing = False
        self.gate = RequestGate()
        self.offloader = Offloader()  # decodes large payloads in a helper process (both transports)
        self.request_log = request_log or RequestLog()
        # --enable_signature_method_name_check: Classify/Regress/MultiInference demand the signature's
        # method_name (TF Serving's default, off: a predict signature of the right shape is served too)
        self.signature_method_name_check = False
        self.shadow: Shadows | None = None  # when a model has a shadow (--shadow)

    @property
    def draining(self) -> bool:
        """The server is shutting down (SIGTERM): readiness answers false, new requests UNAVAILABLE."""
        return self.gate.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        if value:
            self.gate.close()

    @property
    def limits(self) -> ServerLimits:
        """The per-request limits (transports read `max_tensor_bytes` to bound decoding)."""
        return self._limits

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        """TF Serving Predict: validate, run the signature, apply `output_filter`.

        Raises:
            ModelNotFoundError: unknown model/version/label.  InvalidRequestError: unknown signature,
            bad inputs, unknown output_filter alias, batch above the limit.  ResourceExhaustedError:
            too many concurrent requests.  DeadlineExceededError: the deadline passed.
        """
        return await self._on_held_version(request.model, "predict",
                                           lambda served: self._predict(request, served.version, served.runtime))

    async def predict_decoded(self, model: ModelRef,
                              decode: Callable[[ModelMetadata | None], Awaitable[InferenceRequest | None]],
                              ) -> InferenceResponse:
        """TF Serving Predict for a transport that decodes its body against the served signatures (REST's JSON
        `instances` / `inputs`, the Open Inference Protocol's REST).

        `model`'s version is resolved and held once; `decode(metadata)` (that version's signatures) builds the
        request, which runs on that same version: a version loaded or retired meanwhile changes nothing for it.
        When `model` cannot be held, `decode(None)` is awaited first, so a malformed body is answered before
        the missing model (TF Serving's order), then the lookup's error is raised.

        Raises:
            As `predict`, and whatever `decode` raises.
        """
        async def work(served) -> InferenceResponse:
            meta = served.metadata(model.name)
            with tracing.decode_span():
                request = await decode(meta)
            assert request is not None  # decode builds the request whenever it is given metadata
            return await self._predict(request, served.version, served.runtime)

        return await self._on_held_version(model, "predict", work, on_missing=lambda: decode(None))

    async def _on_held_version(self, model: ModelRef, api: str, work, on_missing=None):
        """Await `work(served)` on a held version of `model` (released after), recording the request's count and
        latency under `api` with its status (OK, else `request_status`). When `model` cannot be
        held, `on_missing()` is awaited before the lookup's error is raised (it may raise its own).
        """
        started = time.perf_counter()
        status, version = "OK", ""
        try:
            with tracing.predict_span(api, model.name) as span:  # serving.operations.tracing (None when off)
                try:
                    served = self.manager.hold(model)
                except TfshipError:
                    if on_missing is not None:
                        await on_missing()
                    raise
                try:
                    version = str(served.version)
                    if span is not None:
                        span.set_attribute("tfship.version", served.version)
                    return await work(served)
                finally:
                    self.manager.release(served)
        except BaseException as err:
            status = request_status(err)
            raise
        finally:  # unknown names share one label value: clients cannot grow the metrics without bound
            name = model.name if self.manager.is_configured(model.name) else UNKNOWN_MODEL_LABEL
            self._metrics.requests.record(name, version, api, status, time.perf_counter() - started)

    async def _predict(self, request: InferenceRequest, version: int, runtime) -> InferenceResponse:
        signature, counted, held = self.judge(request, version, runtime)
        return await self.run_judged(request, version, runtime, signature, counted, held)

    def judge(self, request: InferenceRequest, version: int, runtime) -> tuple[Signature, Rows, int]:
        """Every check of a Predict that its layout decides (signature name, inputs against the contract, output
        filter, batch and memory limits): (the signature, the request's `Rows`, the bytes it holds).

        Raises:
            InvalidRequestError, ResourceExhaustedError: as `predict`.
        """
        signatures = runtime.metadata()
        signature = signatures.get(request.signature_name)
        if signature is None:
            raise InvalidRequestError(f"Serving signature name: {echo(request.signature_name)} not found in signature "
                                      f"def; available: {sorted(signatures)}")
        # validates (InvalidRequestError); graph backends judge shapes themselves, as in TF Serving
        shapes = request.check_shapes or not runtime.model_judges_shapes
        counted, held = self.checks.check(signature, request.inputs, shapes, not runtime.resizes_inputs,
                                          getattr(runtime, "declares_ranks", False))
        rows = counted.batch
        if request.output_filter:
            check_output_filter(signature, request.output_filter)
        if self.request_log.sampling_rate > 0.0:
            note_request(model=request.model.name, version=str(version), signature=signature.name, batch_rows=rows)
        if rows == 0:  # refused alike by every backend, batched or not (runtimes disagree on empty batches)
            raise InvalidRequestError("batch of 0 rows: send at least one row")
        limit = self._limits.max_batch_per_request
        if limit and rows is not None and rows > limit:
            raise rows_over_limit(rows, limit)
        cap = self._limits.max_request_memory_bytes
        if cap and held > cap:
            raise memory_over_limit(held, rows, cap)
        return signature, counted, held

    async def run_judged(self, request: InferenceRequest, version: int, runtime, signature: Signature,
                         counted: Rows, held: int) -> InferenceResponse:
        """Run a request `judge` passed on `runtime` (version `version`, held by the caller): deadline, in-flight
        limit, the model call, the shadow's copy, the answer's size. Raises as `predict`.
        """
        deadline = request.deadline
        if deadline is None and self._limits.default_deadline_s:
            deadline = time.monotonic() + self._limits.default_deadline_s
        started = time.perf_counter()
        try:  # a backend failing on an input the signature does not declare: the client's fault (contract.judged)
            outputs = await self._run(runtime, request.inputs, request.signature_name, counted, deadline)
        except Exception as err:
            fault = refault(err, signature, request.inputs, runtime.backend)
            if fault is None:
                raise
            raise fault from err
        if self.shadow is not None:  # serving.dataplane.shadow: a draw and a non-blocking put, nothing more
            self.shadow.offer(request.model.name, version, request.signature_name, request.inputs, outputs,
                              time.perf_counter() - started, deadline)
        if held >= RELEASE_AFTER_BYTES:
            self._release_memory()
        if request.output_filter:
            outputs = {k: outputs[k] for k in request.output_filter}
        check_response_size(outputs, self._limits.max_tensor_bytes)
        return InferenceResponse(request.model.name, version, request.signature_name, outputs)

    async def predict_held(self, served, model_name: str, decoded: Callable[[], InferenceRequest],
                           signature: Signature, counted: Rows, held: int) -> InferenceResponse:
        """`run_judged` of the request `decoded()` builds, on `served`: a version of configured model `model_name`
        that the caller holds (`manager.hold`) and this releases. The count and latency are recorded as `predict`
        records them. Predict's planned path (`serving.tfs.predict_plans`), whose checks of the request's layout
        passed before on this runtime; `decoded` raises its values' errors (recorded too). No spans: that path
        runs with tracing off.
        """
        started, status = time.perf_counter(), "OK"
        try:
            request = decoded()
            return await self.run_judged(request, served.version, served.runtime, signature, counted, held)
        except BaseException as err:
            status = request_status(err)
            raise
        finally:
            self.manager.release(served)
            self._metrics.requests.record(model_name, str(served.version), "predict", status,
                                          time.perf_counter() - started)

    async def _run(self, runtime, inputs, signature_name: str, rows: Rows, deadline: float | None) -> dict:
        cap = self._limits.max_concurrent_requests
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlineExceededError("deadline exceeded before the request reached the model")
        with self._inflight_lock:  # requests arrive on every transport's loop (serving.loops)
            if cap and self._inflight >= cap:
                raise ResourceExhaustedError(f"{self._inflight} requests in flight; limit is {cap}")
            self._inflight += 1
        try:
            with tracing.runtime_span(runtime.backend, rows.batch):
                outputs = runtime.predict_now(inputs, signature_name, rows)  # cheap: inline, no timer
                if outputs is not None:
                    return outputs
                call = runtime.predict_async(inputs, signature_name, rows=rows, deadline=deadline,
                                             executor=self._executor)
                if deadline is None:
                    return await call
                try:
                    async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):  # a timer, not a task
                        return await call
                except TimeoutError:
                    raise DeadlineExceededError("deadline exceeded while the model was running") from None
        finally:
            with self._inflight_lock:
                self._inflight -= 1

    def release_after(self, size: int) -> None:
        """A transport finished a request whose body was `size` bytes: return freed heap pages to the OS when it
        was large (`RELEASE_AFTER_BYTES`; JSON bodies and their parsed lists are far larger than the tensors the
        data plane counts). Call on any event loop.
        """
        if size >= RELEASE_AFTER_BYTES:
            self._release_memory()

    def _release_memory(self) -> None:
        """Return freed heap pages to the OS after a large request, in the background (one at a time)."""
        if self._releasing:
            return
        self._releasing = True

        def release() -> None:
            try:
                release_freed_memory()
            finally:
                self._releasing = False

        asyncio.get_running_loop().run_in_executor(self._executor, release)

    async def metadata(self, ref: ModelRef) -> ModelMetadata:
        """TF Serving GetModelMetadata (`signature_def`): signatures of the targeted version."""
        served = self.manager.resolve(ref)
        note_request(version=str(served.version))
        return served.metadata(ref.name)

    def server_ready(self) -> bool:
        """Open Inference Protocol ServerReady: not draining and every configured model has a version AVAILABLE."""
        names = self.manager.model_names()
        return not self.draining and bool(names) and all(self._available(ModelRef(n)) for n in names)

    def model_ready(self, ref: ModelRef) -> bool:
        """Open Inference Protocol ModelReady: the targeted version (latest: any) is AVAILABLE.

        Raises:
            ModelNotFoundError: unknown model, version or label.
        """
        return not self.draining and bool(self._available(ref))

    def _available(self, ref: ModelRef) -> list[int]:
        return [s.version for s in self.manager.statuses(ref) if s.state is VersionState.AVAILABLE]

    def available_versions(self, ref: ModelRef) -> list[int]:
        """AVAILABLE versions of the model `ref` names (all of them when it names none), ascending."""
        return self._available(ref)

    async def model_status(self, ref: ModelRef) -> list[VersionStatus]:
        """TF Serving GetModelStatus: state of every version of the model (or of one version/label)."""
        return self.manager.statuses(ref)

    async def reload_config(self, configs: list[ModelConfig]) -> None:
        """TF Serving HandleReloadConfigRequest: serve exactly `configs` from now on."""
        await self.manager.apply_config(configs)

    async def infer_examples(self, request: ExamplesRequest) -> ExamplesResponse:
        """TF Serving Classify / Regress / MultiInference: run each task's signature over the examples.

        Every task runs on one held version; each distinct signature runs once (MultiInference's tasks
        name different signatures). Rules and wording: `serving.dataplane.inference`.

        Raises:
            ModelNotFoundError: unknown model or version.  InvalidRequestError: unknown signature, one without
            the task's shape, an answer of the wrong shape or dtype, too many examples.  UnimplementedError:
            a backend that cannot parse tf.Example (ONNX, LiteRT), an unknown task method_name.
            ResourceExhaustedError, DeadlineExceededError: as `predict`.
        """
        async def work(served) -> ExamplesResponse:
            results = await self._infer_examples(request, served.version, served.runtime)
            return ExamplesResponse(request.model.name, served.version, results)

        return await self._on_held_version(request.model, request.api, work)

    async def _infer_examples(self, request: ExamplesRequest, version: int, runtime) -> tuple[TaskResult, ...]:
        inference.check_tasks(request.tasks)
        if runtime.backend != "saved_model":
            raise UnimplementedError(f"{request.api} feeds serialized tf.Example to the model, which only the "
                                     f"saved_model backend can parse; model {request.model.name!r} version {version} "
                                     f"is served by the {runtime.backend} backend: call Predict with tensors")
        signatures = runtime.metadata()
        plans = []
        for task in request.tasks:
            signature = signatures.get(task.signature_name)
            if signature is None:
                prefix = ("Requested signature not found in model graph" if request.api == "multi_inference"
                          else "No signature was found with the name")
                available = sorted(n for n in signatures if not n.startswith("__"))
                raise InvalidRequestError(f"{prefix}: {clip(task.signature_name)}; available: {echo_list(available)}")
            plans.append(inference.output_aliases(signature, task.method, self.signature_method_name_check))
        rows = len(request.examples)
        if rows == 0:
            raise InvalidRequestError("Input is empty. (fill input.example_list.examples or "
                                      "input.example_list_with_context.examples with at least one tf.Example)")
        limit = self._limits.max_batch_per_request
        if limit and rows > limit:
            raise InvalidRequestError(f"{rows} examples exceed the per-request limit of {limit}")
        if self.request_log.sampling_rate > 0.0:
            note_request(model=request.model.name, version=str(version),
                         signature=",".join(t.signature_name for t in request.tasks), batch_rows=rows)
        deadline = request.deadline
        if deadline is None and self._limits.default_deadline_s:
            deadline = time.monotonic() + self._limits.default_deadline_s
        results = []
        for task, aliases in zip(request.tasks, plans):
            examples = {inference.EXAMPLES_INPUT: request.examples}
            outputs = await self._run(runtime, examples, task.signature_name, Rows(rows, rows), deadline)
            outputs = {k: outputs[k] for k in aliases}
            if task.method is inference.ExampleMethod.CLASSIFY:
                results.append(TaskResult(task, inference.classification(outputs, rows)))
            else:
                results.append(TaskResult(task, inference.regression(outputs, rows)))
        return tuple(results)


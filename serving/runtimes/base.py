"""The runtime interface every backend implements, its options, and the explicit registry.

A runtime serves one model version folder (`<base>/<name>/<version>/`). The data plane validates
requests against `metadata()` before calling `predict()`, so backends may assume well-formed input.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tfship.core.contract import Signature
from tfship.core.errors import ConfigError, FailedPreconditionError, InvalidRequestError

if TYPE_CHECKING:
    from tfship.serving.runtimes.published import PublishedArtifact

# A model call expected to take less than this (seconds) runs on the event loop: handing it to a worker
# thread and back costs more (two GIL hand-offs and a self-pipe wake-up, ~25 % of a one-core server's time
# on the identity backend, bench/results/serve-profile.md).
INLINE_CALL_BUDGET_S = 100e-6
log = logging.getLogger(__name__)
_EWMA = 0.2  # weight of the newest call in the per-row cost estimate


class RuntimeLoadError(FailedPreconditionError):
    """A model version failed to load (missing artifact, backend error); the previous version keeps serving."""


class ModelInputError(InvalidRequestError):
    """The backend refused an input value while running the model (an embedding id past the table, a bad
    index): INVALID_ARGUMENT with the backend's own message, as TF Serving answers TensorFlow's
    InvalidArgumentError. Real server faults stay INTERNAL.
    """


def input_rejected(backend: str, inputs: Mapping[str, np.ndarray], err: Exception | str) -> ModelInputError:
    """`ModelInputError` naming the inputs sent and the backend's message (e.g. `indices[0,0] = 10 is not in
    [0, 10)`); callers `raise input_rejected(...) from err`.
    """
    return ModelInputError(f"{backend} rejected the value of input(s) {sorted(inputs)} while running the model: "
                           f"{str(err).strip()}")


@dataclass(frozen=True)
class Rows:
    """How many rows one request carries, counted once (by the data plane, against the signature) and passed on.

    Attributes:
        batch: the request's batch size: dim 0 of the inputs whose signature declares a dynamic dim 0; None when
            no input has a batch dimension. The per-request row limit, the memory estimate and the request log
            use it.
        common: dim 0 shared by every non-scalar input; None when they disagree or every input is a scalar. A
            batching queue merges and splits requests along dim 0 only where this is set (else the request
            runs alone); the per-row cost estimate divides by it.
    """

    batch: int | None
    common: int | None

    @classmethod
    def of(cls, inputs: Mapping[str, np.ndarray], batch: int | None = None) -> Rows:
        """Count `inputs`' `common` rows; `batch` is the signature's count when the caller has one (else `common`)."""
        sizes = {int(np.shape(v)[0]) for v in inputs.values() if np.ndim(v) > 0}
        common = sizes.pop() if len(sizes) == 1 else None
        return cls(common if batch is None else batch, common)

    @property
    def cost(self) -> int:
        """Rows to divide a call's time by (at least 1)."""
        return max(self.common or self.batch or 1, 1)


@dataclass(frozen=True)
class RuntimeOptions:
    """Backend knobs.

    Attributes:
        intra_op_threads: threads inside one op (ONNX Runtime / LiteRT num_threads); 0 = backend default.
        inter_op_threads: threads across ops (ONNX Runtime); 0 = backend default.
        tflite_file: which TFLite artifact to serve (`model.tflite`, `model_float16.tflite`, ...).
        use_gpu: allow CUDA (ONNX Runtime CUDA EP) when available.
        prefer: backends tried first for every version folder, in order, where they can serve it (TF Serving's
            --prefer_tflite_model = `("tflite",)`); the configured backend otherwise.
        saved_model_tags: the MetaGraph tag-set the SavedModel backend loads; None = the `serve` MetaGraph.
        gpu_memory_fraction: fraction of each GPU's memory TensorFlow may take (SavedModel backend, TF Serving's
            --per_process_gpu_memory_fraction); 0 = TensorFlow's default. No effect without a GPU.
        warmup: replay the version's warm-up records at load (TF Serving's --enable_model_warmup).
        warmup_iterations: times each warm-up record runs; 0 or 1 = once.
        artifact: serve this artifact of each version's manifest.json (`--artifact`, e.g. `tflite_int8`): its
            file on its backend (`serving.runtimes.published`); None = the backend and file flags decide.
        allow_ops: op names the op policy allows in a SavedModel (`--allow-ops`, `core.op_policy`), and the TFLite
            custom ops a `.tflite` file may use (`serving.runtimes.tflite_check`); empty: every op that touches the
            host, and every custom op, is refused at load.
        verify_key: a PEM EC public key (`--verify-key`): every version must carry a signature by it, made for
            its model name and version (`serving.storage.signed`), or it is refused before it loads; None: off.
    """

    intra_op_threads: int = 0
    inter_op_threads: int = 0
    tflite_file: str = "model.tflite"
    use_gpu: bool = True
    prefer: tuple[str, ...] = ()
    saved_model_tags: tuple[str, ...] | None = None
    gpu_memory_fraction: float = 0.0
    warmup: bool = True
    warmup_iterations: int = 0
    artifact: str | None = None
    allow_ops: tuple[str, ...] = ()
    verify_key: Path | None = None


class Runtime(abc.ABC):
    """One backend serving one version folder.

    Lifecycle: `load()` (sets `ready`), any number of concurrent `predict()`s, `unload()`.
    """

    name: str = ""
    # True when the backend feeds inputs into the model by name and lets the model judge their shapes, as TF
    # Serving's SavedModel and TFLite sessions do: the data plane then checks names and dtypes only
    # (`serving.dataplane.contract.validate_inputs`); what the model refuses is INVALID_ARGUMENT.
    model_judges_shapes: bool = False
    # True when the backend resizes its inputs to what is fed (TF Serving's TfLiteSession over a file without
    # signature runners): the declared dimensions are the file's build-time sizes, not a contract, so the data
    # plane does not hold a request to them (`serving.dataplane.contract.validate_inputs(fixed_dims=False)`).
    resizes_inputs: bool = False
    # File names (glob patterns) of the published artifacts this backend serves (`--artifact`,
    # `serving.runtimes.published`): the manifest's file for an artifact picks the backend.
    artifact_files: tuple[str, ...] = ()
    artifact: str = ""  # the manifest's artifact this runtime serves (set by `--artifact`); "" otherwise
    published: PublishedArtifact | None = None  # name, file, backend, sha256 under `--artifact`
    # The load-time checks' verdict on the file (the op policy for a SavedModel): a refused file never loads.
    policy_verdict: str = "passed"

    def __init__(self, version_dir: Path, options: RuntimeOptions | None = None) -> None:
        self.version_dir = Path(version_dir)
        self.options = options or RuntimeOptions()
        self.ready = False

    @property
    def declares_ranks(self) -> bool:
        """True when the version was published by tfship (its folder holds `manifest.json`): the signature is the
        contract tfship exported and the parity gate proved, so an input of another rank than declared (scalars
        where `[?,1]` is declared) is refused before the model runs (`contract.validate_inputs(ranks=True)`).
        A folder without a manifest (TF Serving's own models) keeps TF Serving's leniency. Looked up once (a
        served version's folder does not change; this was a `stat` per request).
        """
        known = self._declares_ranks
        if known is None:
            from tfship.core.manifest import MANIFEST_FILE

            known = self._declares_ranks = (self.version_dir / MANIFEST_FILE).is_file()
        return known

    @classmethod
    @abc.abstractmethod
    def can_serve(cls, version_dir: Path) -> bool:
        """True when the artifact exists in `version_dir` and the backend library is importable."""

    @abc.abstractmethod
    def load(self) -> None:
        """Load the artifact; raise `RuntimeLoadError` (with the cause) if it cannot be served."""

    @property
    def backend(self) -> str:
        """The backend that runs the model (`onnx`, ...); a wrapper reports the runtime it wraps."""
        return self.name

    _declares_ranks: bool | None = None  # `declares_ranks`, once looked up
    _seconds_per_row: float | None = None  # measured cost of `predict` (moving average), None before a call

    @abc.abstractmethod
    def predict(self, inputs: Mapping[str, np.ndarray],
                signature_name: str = "serving_default") -> dict[str, np.ndarray]:
        """Run one signature on the calling thread.

        Args:
            inputs: alias -> array (batch on dim 0), already validated against `metadata()`.
            signature_name: which signature to run.

        Returns:
            alias -> array, every output of the signature.
        """

    async def predict_async(self, inputs: Mapping[str, np.ndarray], signature_name: str = "serving_default", *,
                            rows: Rows, deadline: float | None = None,
                            executor: Executor | None = None) -> dict[str, np.ndarray]:
        """Run one signature for the event loop; the data plane's only way to call a runtime.

        The default runs `predict()` on a thread of `executor`, or on the event loop itself once calls are
        measured cheaper than `INLINE_CALL_BUDGET_S` for this many rows (the thread hop would cost more).
        Queueing wrappers override it by composition (`serving.dataplane.batching.Batched` awaits its slice of a
        merged call, no thread parked per request) and use `deadline` to drop a request that expired while
        queued; the default ignores it (the data plane times the call out itself).

        Args:
            inputs: as `predict()`.
            signature_name: as `predict()`.
            rows: the request's rows, as the data plane counted them (`Rows.of` for a caller without a signature).
            deadline: when the caller stops waiting, `time.monotonic()` seconds; None = no deadline.
            executor: threads for the blocking call; None = the loop's default executor.
        """
        outputs = self.predict_now(inputs, signature_name, rows)
        if outputs is not None:
            return outputs
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, self._timed_predict, inputs, signature_name, rows.cost)

    def predict_now(self, inputs: Mapping[str, np.ndarray], signature_name: str,
                    rows: Rows) -> dict[str, np.ndarray] | None:
        """`predict()` on the calling thread (the event loop) when calls are measured cheaper than
        `INLINE_CALL_BUDGET_S` for `rows`; None (nothing run) otherwise, and always for a runtime that overrides
        `predict_async` (it never measures `predict` here). Nothing can time out while it runs: the loop waits.
        """
        estimate = self._seconds_per_row
        if estimate is not None and estimate * rows.cost < INLINE_CALL_BUDGET_S:
            return self._timed_predict(inputs, signature_name, rows.cost)
        return None

    def _timed_predict(self, inputs: Mapping[str, np.ndarray], signature_name: str, rows: int) -> dict[str, np.ndarray]:
        """`predict()`, timed: keeps the per-row cost estimate (seconds) up to date."""
        started = time.perf_counter()
        outputs = self.predict(inputs, signature_name)
        per_row = (time.perf_counter() - started) / rows
        previous = self._seconds_per_row
        self._seconds_per_row = per_row if previous is None else previous + _EWMA * (per_row - previous)
        return outputs

    @abc.abstractmethod
    def metadata(self) -> dict[str, Signature]:
        """The signature contract served, by signature name (TF Serving's SignatureDefMap)."""

    def unload(self) -> None:
        """Release the backend's resources; `ready` becomes False."""
        self.ready = False


class RuntimeRegistry:
    """Backends by name; registering a name twice is refused."""

    def __init__(self) -> None:
        self._classes: dict[str, type[Runtime]] = {}

    def register(self, name: str, cls: type[Runtime]) -> None:
        """Add a backend class under `name`; raises `ConfigError` on a duplicate name."""
        if name in self._classes:
            raise ConfigError(f"runtime {name!r} is already registered ({self._classes[name].__qualname__})")
        self._classes[name] = cls

    def names(self) -> list[str]:
        """Registered backend names, in registration order."""
        return list(self._classes)

    def get(self, name: str) -> type[Runtime]:
        """Backend class for `name`; raises `ConfigError` naming the known backends."""
        try:
            return self._classes[name]
        except KeyError:
            raise ConfigError(f"unknown backend {name!r}; known: {self.names() + ['auto']}") from None

    def create(self, backend: str, version_dir: Path, options: RuntimeOptions | None = None) -> Runtime:
        """Instantiate `backend` for `version_dir`; `auto` picks the first registered backend that can serve it.

        Backends in `options.prefer` come first wherever they can serve `version_dir`. With `options.artifact`
        the version's manifest decides backend and file (`serving.runtimes.published.resolve_artifact`).

        Raises:
            RuntimeLoadError: `auto` found no servable artifact in `version_dir`.
            ConfigError: unknown backend name; `options.artifact` not published in `version_dir`
                (`ArtifactNotPublishedError`), or served by another backend than a non-`auto` `backend`.
        """
        if options is not None and options.artifact is not None:
            return self._create_artifact(backend, version_dir, options, options.artifact)
        for name in options.prefer if options else ():
            cls = self.get(name)
            if cls.can_serve(version_dir):
                return cls(version_dir, options)
        if backend != "auto":
            return self.get(backend)(version_dir, options)
        for cls in self._classes.values():
            if cls.can_serve(version_dir):
                return cls(version_dir, options)
        raise RuntimeLoadError(f"no backend among {self.names()} can serve {version_dir} "
                               "(need saved_model.pb with TensorFlow installed, model.onnx or model.tflite)")

    def resolve_artifact(self, backend: str, version_dir: Path, artifact: str) -> PublishedArtifact:
        """`serving.runtimes.published.PublishedArtifact` for `--artifact` in `version_dir`, on these backends.

        Raises:
            ConfigError: not published there (`ArtifactNotPublishedError`), or served by another backend than a
                non-`auto` `backend`.
        """
        from tfship.serving.runtimes.published import resolve_artifact

        chosen = resolve_artifact(version_dir, artifact, self._classes)
        if backend not in ("auto", chosen.backend):
            raise ConfigError(f"--artifact {chosen.name} is {chosen.file}, served by the {chosen.backend} backend; "
                              f"--backend {backend} contradicts it (leave --backend auto)")
        return chosen

    def _create_artifact(self, backend: str, version_dir: Path, options: RuntimeOptions, artifact: str) -> Runtime:
        """The runtime for the published artifact `options.artifact` (its file, on its backend); logged.
        Options that choose another file (`tflite_file`, `prefer`) are refused, whichever door they came by.
        """
        from tfship.serving.runtimes.published import check_artifact_flags

        check_artifact_flags(options.artifact, options.tflite_file, bool(options.prefer),
                             RuntimeOptions.tflite_file)
        chosen = self.resolve_artifact(backend, version_dir, artifact)
        runtime = self.get(chosen.backend)(version_dir, replace(options, tflite_file=chosen.file, prefer=()))
        runtime.artifact = chosen.name
        runtime.published = chosen
        log.info("%s: serving artifact %s (%s, sha256 %s as published in manifest.json) on the %s backend",
                 version_dir, chosen.name, chosen.file, chosen.sha256[:12], chosen.backend)
        return runtime


"""Model manager: which versions are loaded, their lifecycle, and routing requests to one of them.

Follows TF Serving's AspiredVersionsManager in spirit: versions found under `<base_path>/<int>/` are
selected by the model's version policy, loaded (and warmed up) before they receive traffic, and an
old version is unloaded only after the new one is AVAILABLE and its own in-flight requests finished.
A version that fails to load is reported (state END with the error) and retried on a later poll only
once its folder changed (a file's size or mtime, a file added or removed) or disappeared; the versions
already serving keep serving. Under `--verify-key` (`RuntimeOptions.verify_key`) each version's signature is
checked first (`serving.storage.signed`): an unsigned, tampered or substituted version fails to load that way.

A new config (startup or HandleReloadConfigRequest) is checked against the disk as a whole before
anything changes (`check_config`): a bad entry refuses the whole config and the old one keeps serving.
An explicitly empty config is valid, as in TF Serving, and unloads every model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

from tfship.core.echo import clip, echo
from tfship.core.errors import InvalidRequestError, ModelNotFoundError, TfshipError, UnavailableError
from tfship.core.locations import BucketUrl
from tfship.serving.dataplane.memory import collect_unloaded, freeze_loaded_heap, release_freed_memory
from tfship.serving.dataplane.model_config import ModelConfig
from tfship.serving.dataplane.types import ModelMetadata, ModelRef, VersionState, VersionStatus
from tfship.serving.dataplane.version_folders import check_config, fingerprint, version_folders
from tfship.serving.dataplane.warmup import warmup_predicts
from tfship.serving.runtimes import REGISTRY, Runtime, RuntimeLoadError, RuntimeOptions
from tfship.serving.storage.mirror import BucketMirrors
from tfship.serving.storage.signed import SignatureError, Verification, verify_version

log = logging.getLogger(__name__)

RuntimeWrapper = Callable[[Runtime], Runtime]


@dataclass
class ServedVersion:
    """One version's state, runtime and in-flight request count."""

    version: int
    state: VersionState = VersionState.START
    runtime: Runtime | None = None
    error: TfshipError | None = None
    fingerprint: tuple = ()  # the folder's files when the load was tried (a failed load is retried on change)
    verification: dict | None = None  # under --verify-key: manifest sha256, signer's key id, op-policy verdict
    inflight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    _metadata: tuple | None = field(default=None, repr=False)  # (runtime, ModelMetadata) of `metadata`

    def metadata(self, name: str) -> ModelMetadata:
        """This loaded version's `ModelMetadata` as model `name`: signatures, backend and, under `--artifact`, the
        artifact; made once per runtime (the data plane asks for it per Predict).
        """
        runtime, known = self.runtime, self._metadata
        assert runtime is not None, "metadata() of a version that holds no runtime"  # served versions hold one
        if known is not None and known[0] is runtime and known[1].model_name == name:
            return known[1]
        meta = ModelMetadata(name, self.version, runtime.metadata(), runtime.backend,
                             getattr(runtime, "published", None), self.verification)
        self._metadata = (runtime, meta)
        return meta

    def status(self) -> VersionStatus:
        """This version as a GetModelStatus entry."""
        if self.error is None:
            return VersionStatus(self.version, self.state, artifact=getattr(self.runtime, "published", None))
        return VersionStatus(self.version, self.state, self.error.grpc_code, str(self.error))


@dataclass
class _Model:
    config: ModelConfig
    versions: dict[int, ServedVersion] = field(default_factory=dict)


class ModelManager:
    """Loads, routes and unloads model versions for the data plane.

    Args:
        backend: runtime name (`auto`, `saved_model`, `onnx`, `tflite`).
        options: backend options for every runtime created.
        executor: threads used for blocking load/unload/warmup calls.
        wrap: applied to each loaded runtime before it serves (e.g. `Batched`); identity by default.
        on_change: awaited with (model name, has an AVAILABLE version) after each reconcile.
        metrics: optional `serving.operations.metrics.Metrics`; load events are counted as `loaded`,
            `load_failed`, `unloaded`.
    """

    def __init__(self, backend: str, options: RuntimeOptions, executor: Executor,
                 wrap: RuntimeWrapper | None = None,
                 on_change: Callable[[str, bool], Awaitable[None]] | None = None, metrics=None) -> None:
        self._backend = backend
        self._options = options
        self._mirrors = BucketMirrors()  # object-store base paths: their verified local cache
        self._executor = executor
        self._wrap = wrap or (lambda runtime: runtime)
        self._on_change = on_change or _ignore
        self._models: dict[str, _Model] = {}
        self._lock = asyncio.Lock()
        self._metrics = metrics
        # Requests hold and release versions from every transport's loop (serving.loops); holds, releases and
        # the start of an unload are decided under this lock, and `idle` events are set on the manager's loop.
        self._holds = threading.Lock()
        self._home: asyncio.AbstractEventLoop | None = None

    def _event(self, name: str, event: str) -> None:
        if self._metrics is not None:
            self._metrics.load_events.labels(name, event).inc()

    # ---- configuration and lifecycle -------------------------------------------------------
    async def apply_config(self, configs: list[ModelConfig]) -> None:
        """Serve exactly `configs`: models no longer listed are unloaded, new ones loaded (TF Serving's reload).

        Raises:
            ConfigError: `check_config` refused `configs`; nothing changed (the old config keeps serving).
        """
        self._home = asyncio.get_running_loop()  # the loop that loads, unloads and waits on `idle`
        configs = await self._localize(configs)  # bucket versions fetched and verified into the local cache
        check_config(configs)
        async with self._lock:
            wanted = {c.name: c for c in configs}
            for name in [n for n in self._models if n not in wanted]:
                model = self._models.pop(name)
                for served in list(model.versions.values()):
                    await self._unload(served, name)
                await self._on_change(name, False)
            for name, config in wanted.items():
                model = self._models.setdefault(name, _Model(config))
                # versions load under the old labels: a label moved to a version still loading would answer
                # NOT_FOUND until it is AVAILABLE (a promotion must never interrupt the label's clients)
                model.config = dataclasses.replace(config, labels=model.config.labels)
            await self._reconcile_locked()
            for name, config in wanted.items():
                self._models[name].config = config
            for name in wanted:  # only now may a version the old labels held be unloaded
                await self._reconcile_model(name, self._models[name])

    async def reconcile(self) -> None:
        """Look at disk again: load newly selected versions, then unload deselected ones."""
        async with self._lock:
            await self._reconcile_locked()

    async def poll_forever(self, interval_s: float) -> None:
        """Call `reconcile()` every `interval_s` seconds (TF Serving's file_system_poll_wait_seconds)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.reconcile()
            except Exception:  # keep polling; the failure is logged with its traceback
                log.exception("model repository poll failed")

    async def unload_all(self) -> None:
        """Unload every version after its in-flight requests finish (shutdown)."""
        async with self._lock:
            for name, model in self._models.items():
                for served in list(model.versions.values()):
                    await self._unload(served, name)

    async def _localize(self, configs: list[ModelConfig]) -> list[ModelConfig]:
        if not any(c.source or isinstance(c.base_path, BucketUrl) for c in configs):
            return configs
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._mirrors.localize, configs)

    async def _reconcile_locked(self) -> None:
        for name, model in self._models.items():
            if model.config.source is not None:
                try:  # the bucket first: new complete versions land in the cache, removed ones leave it
                    model.config = (await self._localize([model.config]))[0]
                except Exception:  # an unreachable bucket: nothing local changes, the next poll retries
                    log.exception("syncing model %s from %s failed; retrying on the next poll", name,
                                  model.config.source)
                    continue
            try:
                await self._reconcile_model(name, model)
            except Exception:  # one model's trouble never stops the others, nor the poller
                log.exception("reconciling model %s with %s failed; retrying on the next poll", name,
                              model.config.base_path)

    async def _reconcile_model(self, name: str, model: _Model) -> None:
        base = model.config.base_path
        assert isinstance(base, Path)  # a bucket's versions are read from its local mirror (`_localize`)
        on_disk = version_folders(base)
        for version in [v for v, s in model.versions.items() if s.error is not None and (
                v not in on_disk or s.fingerprint != fingerprint(on_disk[v]))]:
            del model.versions[version]  # gone or changed since it failed: forget the failure, try again
        failed = {v for v, s in model.versions.items() if s.error is not None}
        desired = set(model.config.policy.select([v for v in on_disk if v not in failed]))
        for version in [v for v, s in model.versions.items()
                        if s.state is VersionState.END and s.error is None and v in desired]:
            del model.versions[version]
        for version in sorted(desired - set(model.versions), reverse=True):
            await self._load(model, version, on_disk[version])
        labelled = set(model.config.labels.values())  # a label's clients keep their version until it moves
        for version, served in list(model.versions.items()):
            if version in desired or served.state is not VersionState.AVAILABLE:
                continue
            if version in labelled and version in on_disk:
                continue
            others = [s for v, s in model.versions.items() if v != version and s.state is VersionState.AVAILABLE]
            if others or version not in on_disk:
                await self._unload(served, name)
        await self._on_change(name, self._available(model) != [])

    async def _load(self, model: _Model, version: int, path: Path) -> None:
        served = model.versions[version] = ServedVersion(version, VersionState.LOADING, fingerprint=fingerprint(path))
        loop = asyncio.get_running_loop()
        try:
            served.runtime, served.verification = await loop.run_in_executor(
                self._executor, self._load_blocking, path, model.config.name, version)
        except TfshipError as err:
            served.state, served.error = VersionState.END, err
            log.error("failed to load %s version %d: %s", model.config.name, version, err)
            self._event(model.config.name, "load_failed")
            return
        except Exception as err:  # a backend bug: keep the cause, report a load failure
            served.state, served.error = VersionState.END, TfshipError(f"loading {path} failed: {err!r}")
            log.exception("failed to load %s version %d", model.config.name, version)
            self._event(model.config.name, "load_failed")
            return
        served.idle.set()
        served.state = VersionState.AVAILABLE
        self._event(model.config.name, "loaded")
        log.info("model %s version %d AVAILABLE (%s)", model.config.name, version, type(served.runtime).__name__)

    def _load_blocking(self, path: Path, name: str, version: int) -> tuple[Runtime, dict | None]:
        # --verify-key: the signature first, before any file is read; then a damaged warm-up file refuses the
        # version before anything loads (--enable_model_warmup=false: not read)
        verified = verify_signature(path, self._options.verify_key, name, version)
        warmup = warmup_predicts(path) if self._options.warmup else []
        runtime = REGISTRY.create(self._backend, path, self._options)
        runtime.load()
        for signature_name, inputs in warmup * max(self._options.warmup_iterations, 1):
            try:
                runtime.predict(inputs, signature_name)
            except Exception as err:
                runtime.unload()
                raise TfshipError(f"warmup request for signature {signature_name!r} failed on {path}: {err}") from err
        record = None if verified is None else verified.to_json() | {"op_policy": runtime.policy_verdict}
        wrapped = self._wrap(runtime)
        freeze_loaded_heap()  # the collector never walks the loaded model's objects again (serving.dataplane.memory)
        return wrapped, record

    async def _unload(self, served: ServedVersion, name: str) -> None:
        if served.state is not VersionState.AVAILABLE:
            return
        with self._holds:  # from here no request can hold it; those holding it are waited for
            served.state = VersionState.UNLOADING
        await served.idle.wait()
        runtime, served.runtime = served.runtime, None
        assert runtime is not None  # an AVAILABLE version holds its runtime
        await asyncio.get_running_loop().run_in_executor(self._executor, _unload_and_release, runtime)
        served.state = VersionState.END
        self._event(name, "unloaded")

    # ---- routing and status ----------------------------------------------------------------
    @staticmethod
    def _available(model: _Model) -> list[ServedVersion]:
        return sorted((s for s in model.versions.values() if s.state is VersionState.AVAILABLE),
                      key=lambda s: s.version)

    def _model(self, name: str) -> _Model:
        try:
            return self._models[name]
        except KeyError:
            raise ModelNotFoundError(f"Servable not found for request: Latest({clip(name)}); "
                                     f"served models: {sorted(self._models)}") from None

    def resolve(self, ref: ModelRef) -> ServedVersion:
        """The AVAILABLE version a request targets.

        Raises:
            ModelNotFoundError: unknown model or version (TF Serving: NOT_FOUND).
            InvalidRequestError: unknown version label (TF Serving: INVALID_ARGUMENT).
            UnavailableError: the model is known but no version is AVAILABLE yet.
        """
        model = self._model(ref.name)
        # list(): one C call, so a version added on another thread meanwhile cannot break the iteration
        available = {v: s for v, s in list(model.versions.items()) if s.state is VersionState.AVAILABLE}
        if ref.label is not None:
            if ref.label not in model.config.labels:
                raise _unknown_label(ref, model.config.labels)
            ref = ModelRef(ref.name, model.config.labels[ref.label])
        if ref.version is not None:
            if ref.version not in available:
                raise ModelNotFoundError(f"Servable not found for request: {ref.describe()}; "
                                         f"available versions: {sorted(available)}")
            return available[ref.version]
        if not available:
            raise UnavailableError(f"model {echo(ref.name)} has no version available yet")
        return available[max(available)]

    def hold(self, ref: ModelRef) -> ServedVersion:
        """Resolve `ref` (raises as `resolve()`) and hold that version for one request: it is not unloaded
        until `release()` is called with it. Synchronous: no coroutine per request. Callable from any thread.
        """
        with self._holds:  # resolved and held at once: an unload starting meanwhile waits for this hold
            served = self.resolve(ref)
            served.inflight += 1
            served.idle.clear()
        return served

    def release(self, served: ServedVersion) -> None:
        """End one request's hold taken by `hold()`; the version may be unloaded once none is left. Callable
        from any thread: `idle` is set on the manager's loop, once no hold is left there.
        """
        with self._holds:
            served.inflight -= 1
            unheld = served.inflight == 0
        if not unheld:
            return
        home = self._home
        try:
            on_home = home is None or asyncio.get_running_loop() is home
        except RuntimeError:  # no loop in this thread
            on_home = False
        if on_home or home is None:
            served.idle.set()
        else:
            home.call_soon_threadsafe(self._set_idle_if_unheld, served)

    def _set_idle_if_unheld(self, served: ServedVersion) -> None:
        """On the manager's loop: `idle` for a version released elsewhere, unless it was held again since."""
        with self._holds:
            if served.inflight == 0:
                served.idle.set()

    def statuses(self, ref: ModelRef) -> list[VersionStatus]:
        """GetModelStatus entries for the model (or its one version/label), ascending by version."""
        model = self._model(ref.name)
        version = model.config.labels.get(ref.label) if ref.label is not None else ref.version
        if ref.label is not None and version is None:
            raise _unknown_label(ref, model.config.labels)
        if version is not None:
            if version not in model.versions:
                raise ModelNotFoundError(f"Could not find version {version} of model {clip(ref.name)}")
            return [model.versions[version].status()]
        return [model.versions[v].status() for v in sorted(model.versions)]

    def is_configured(self, name: str) -> bool:
        """Whether `name` is a configured model (loaded or not)."""
        return name in self._models

    def model_names(self) -> list[str]:
        """Configured model names."""
        return sorted(self._models)


async def _ignore(name: str, available: bool) -> None:
    return None


def _unknown_label(ref: ModelRef, labels) -> InvalidRequestError:
    """TF Serving's answer to a label the model does not define: INVALID_ARGUMENT (not NOT_FOUND)."""
    assert ref.label is not None  # asked for a version by label
    return InvalidRequestError(f"Unrecognized servable version label: {clip(ref.label)} (model {echo(ref.name)}; "
                               f"labels: {sorted(labels)})")


def _unload_and_release(runtime: Runtime) -> None:
    """Unload, collect the runtime's reference cycles (TensorFlow's loaded objects hold some) and hand the freed
    heap back to the OS, so RSS stays flat across hot swaps (bench/results/hotswap-latest.md). Blocking.
    """
    runtime.unload()
    collect_unloaded()  # its cycles, frozen or not
    release_freed_memory()


def verify_signature(path: Path, public_key: Path | None, name: str, version: int) -> Verification | None:
    """`--verify-key`: the version's signature checked before anything reads it (`serving.storage.signed`).

    Raises:
        RuntimeLoadError: unsigned, tampered with, substituted or signed by another key (one line, FAILED_PRECONDITION).
    """
    if public_key is None:
        return None
    try:
        return verify_version(path, public_key, name, version)
    except SignatureError as err:
        raise RuntimeLoadError(str(err)) from None

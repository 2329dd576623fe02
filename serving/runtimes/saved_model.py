"""`saved_model` backend: a SavedModel's MetaGraph as a graph in a Session, as TF Serving loads it.

The MetaGraph chosen by tag-set is imported into its own `tf.Graph`; `tf.compat.v1.saved_model.load`
restores its variables, maps its assets and runs its init op (`main_op` / `legacy_init_op` /
`__saved_model_init_op`) in a private `tf.compat.v1.Session`; each call feeds and fetches by the tensor names
of the signature_def. This serves TF1 exports (`SavedModelBuilder`, Estimators, TFX: `ParseExample` behind
classify / regress / predict signatures, inputs that are graph tensors rather than placeholders) exactly as
TF Serving does, where `tf.saved_model.load` re-traces them and refuses some ("Shape must be rank 1 but is
rank 0 for ParseExample"). For TF2 exports it answers the same as their restored functions, 4 to 6 times
faster per call, with the same load time and memory (`python -m bench.serve.saved_model_engines`, docs/tf-serving.md).

TensorFlow is imported only inside `load()` and the call path.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from tfship.core.contract import Signature
from tfship.core.errors import GRPC_CODE_NAMES, ModelError, OpPolicyError, UnimplementedError, tensorflow_failure
from tfship.core.op_policy import check_saved_model, raise_if_refused
from tfship.core.saved_model import SERVE_TAGS, read_signatures, serving_tags
from tfship.serving.runtimes.base import Runtime, RuntimeLoadError, RuntimeOptions, input_rejected

log = logging.getLogger(__name__)


class GraphSession:
    """A MetaGraph in its own `tf.Graph` and `tf.compat.v1.Session`, fed and fetched by tensor name.

    Each (signature, fed aliases) pair runs through one callable made from `CallableOptions`, so a call is
    one `TF_SessionRunCallable`: as TF Serving's C++ `Session::Run`, it does not compare a fed value's shape
    with the placeholder's declared one (Python's `Session.run` does, and would refuse a `[3]` tensor fed to
    a `[-1, 1]` input that the graph itself accepts); the graph's own ops decide, and dtypes must match.
    Callables are thread-safe, so concurrent calls share one session, as in TF Serving.
    """

    def __init__(self, version_dir: Path, tags: list[str], signatures: Mapping[str, Signature],
                 options: RuntimeOptions) -> None:
        import tensorflow as tf

        self._graph = tf.Graph()
        config = tf.compat.v1.ConfigProto(allow_soft_placement=True,
                                          intra_op_parallelism_threads=options.intra_op_threads,
                                          inter_op_parallelism_threads=options.inter_op_threads)
        self._session = tf.compat.v1.Session(graph=self._graph, config=config)
        from tensorflow.python.util import deprecation

        # TF 1's loader is deprecated in TF 2 and says so on every load, in the middle of a run's stage lines;
        # it is the one loader that fills a Session (TF Serving's own route), so its notice is silenced here.
        with self._graph.as_default(), deprecation.silence():
            tf.compat.v1.saved_model.load(self._session, tags, str(version_dir))
            self.unrestored = _unrestored_variables(self._graph, self._session)
        self._signatures = dict(signatures)
        self._callables: dict[tuple[str, tuple[str, ...]], tuple[Callable[..., list], dict[str, tuple[bool, int]]]] = {}
        self._lock = threading.Lock()

    def _callable(self, signature_name: str,
                  aliases: tuple[str, ...]) -> tuple[Callable[..., list], dict[str, tuple[bool, int]]]:
        """(callable, plan) for one signature fed `aliases`: the callable takes the fed arrays in `aliases`
        order and returns the fetched ones; `plan[output alias]` is `(True, i)` for fetched value i or
        `(False, j)` for fed array j (an output that is also an input, e.g. an identity: a Session may not
        fetch what it is fed, `Session.run` hands the fed value back, so do we).
        """
        key = (signature_name, aliases)
        found = self._callables.get(key)
        if found is not None:
            return found
        from tensorflow.core.protobuf import config_pb2

        signature = self._signatures[signature_name]
        feeds = [signature.inputs[a].tensor_name for a in aliases]
        fetches: list[str] = []
        plan: dict[str, tuple[bool, int]] = {}
        for alias, spec in signature.outputs.items():
            if spec.tensor_name in feeds:
                plan[alias] = (False, feeds.index(spec.tensor_name))
            else:
                plan[alias] = (True, len(fetches))
                fetches.append(spec.tensor_name)
        # `_make_callable_from_options` is the Session's own callable API (Keras 2 and tf.compat.v1 code use it);
        # the public `make_callable` with feeds routes through `Session.run` and its placeholder-shape check.
        options = config_pb2.CallableOptions(feed=feeds, fetch=fetches)
        with self._lock:
            found = self._callables.get(key)
            if found is None:
                found = self._callables[key] = (self._session._make_callable_from_options(options), plan)
        return found

    def run(self, signature_name: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one signature: `inputs` alias -> array fed to the signature's tensors; every output returned."""
        aliases = tuple(sorted(inputs))  # one callable per signature, whatever order a client names inputs in
        call, plan = self._callable(signature_name, aliases)
        fed = [inputs[a] for a in aliases]
        values = call(*fed)  # a scalar string / number comes back as Python bytes / a numpy scalar: made arrays
        return {alias: np.asarray(values[i] if fetched else fed[i]) for alias, (fetched, i) in plan.items()}

    def close(self) -> None:
        self._callables = {}
        self._session.close()


def _unrestored_variables(graph, session) -> list[str]:
    """Shared names of the graph's resource variables the MetaGraph's restore left uninitialized.

    Some TF2 SavedModels (a `tf.Module` holding a Keras 3 model under its own variable names) restore their
    checkpoint into other handles than the ones the serving functions read; in a Session those reads fail on
    every call ("Could not find variable ..."), so such a model is served by TensorFlow's object loader instead.
    """
    import tensorflow as tf

    handles = [op for op in graph.get_operations() if op.type == "VarHandleOp"]
    if not handles:
        return []
    flags = session.run([tf.raw_ops.VarIsInitializedOp(resource=op.outputs[0]) for op in handles])
    return [op.get_attr("shared_name").decode() for op, ok in zip(handles, flags) if not ok]


class ObjectSession:
    """A SavedModel loaded with `tf.saved_model.load` (TensorFlow's object loader), each signature called as its
    concrete function: for the TF2 exports whose variables a graph Session cannot restore (`_unrestored_variables`).
    A shape or dtype the function's input signature refuses raises `ModelInputError` (INVALID_ARGUMENT).
    """

    def __init__(self, version_dir: Path, tags: list[str]) -> None:
        import tensorflow as tf

        self._loaded = tf.saved_model.load(str(version_dir), tags=tags)

    def run(self, signature_name: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import tensorflow as tf

        assert self._loaded is not None, "closed"
        function = self._loaded.signatures[signature_name]
        try:
            outputs = function(**{alias: tf.constant(value) for alias, value in inputs.items()})
        except (TypeError, ValueError) as err:  # what the function's input signature refuses
            raise input_rejected("TensorFlow", inputs, err) from err
        return {alias: np.asarray(value.numpy()) for alias, value in outputs.items()}

    def close(self) -> None:
        self._loaded = None


class SavedModelRuntime(Runtime):
    """Serves `saved_model.pb` + `variables/` with TensorFlow (imported only in `load()`).

    Metadata is read from `saved_model.pb` itself, exactly what TF Serving reports; calls run in a
    `GraphSession`. A value the graph refuses (TensorFlow's InvalidArgumentError: a wrong dtype, a shape
    its ops cannot take, an unparsable tf.Example) raises `ModelInputError` (INVALID_ARGUMENT); any other
    TensorFlow status but INTERNAL / UNKNOWN raised inside the model (NotFound, OutOfRange, FailedPrecondition,
    ResourceExhausted, PermissionDenied, ...) raises `ModelError` with that code (TF Serving passes it on). Before
    loading, the version is judged by the op policy (`core.op_policy`): a graph touching the host is never loaded.
    """

    name = "saved_model"
    artifact_files = ("saved_model.pb",)  # `--artifact saved_model`
    model_judges_shapes = True  # fed by name, as TF Serving's session: the graph decides what shapes it takes

    def __init__(self, version_dir: Path, options: RuntimeOptions | None = None) -> None:
        super().__init__(version_dir, options)
        self._session: GraphSession | ObjectSession | None = None
        self._signatures: dict[str, Signature] = {}

    @classmethod
    def can_serve(cls, version_dir: Path) -> bool:
        return (Path(version_dir) / "saved_model.pb").is_file() and importlib.util.find_spec("tensorflow") is not None

    def load(self) -> None:
        """Judge the version by the op policy (before TensorFlow is imported or anything runs), then load it.

        Raises:
            RuntimeLoadError: the op policy refused it (one line: the ops, where, what reaches them; `--allow-ops`
                allows an op by name), or TensorFlow could not load it.
        """
        try:
            report = raise_if_refused(check_saved_model(self.version_dir, self.options.allow_ops), "--allow-ops")
            allowed = sorted({finding.op for finding in report.allowed})
            self.policy_verdict = f"passed, allowed by --allow-ops: {', '.join(allowed)}" if allowed else "passed"
        except OpPolicyError as err:  # names the folder already
            raise RuntimeLoadError(str(err)) from err
        except Exception as err:
            raise RuntimeLoadError(f"cannot load SavedModel {self.version_dir}: {err}") from err
        try:
            from tfship.serving.runtimes.tf_gpu import apply_gpu_memory_fraction

            apply_gpu_memory_fraction(self.options.gpu_memory_fraction)  # before TensorFlow sets up a GPU
            tags = self.options.saved_model_tags or SERVE_TAGS  # TF Serving's --saved_model_tags
            self._signatures = read_signatures(self.version_dir, tags, include_internal=True)
            tag_set = serving_tags(self.version_dir, tags)
            self._session = GraphSession(self.version_dir, tag_set, self._signatures, self.options)
            if self._session.unrestored:  # the Session cannot read its variables: TensorFlow's object loader
                log.info("%s: %d variables not restored in a Session (%s, ...); served with tf.saved_model.load",
                         self.version_dir, len(self._session.unrestored), self._session.unrestored[0])
                self._session.close()
                self._session = ObjectSession(self.version_dir, tag_set)
        except Exception as err:
            raise RuntimeLoadError(f"cannot load SavedModel {self.version_dir}: {err}") from err
        self.ready = True

    def predict(self, inputs: Mapping[str, np.ndarray],
                signature_name: str = "serving_default") -> dict[str, np.ndarray]:
        import tensorflow as tf

        session = self._session
        assert session is not None, "load() first"
        try:
            return session.run(signature_name, inputs)
        except tf.errors.InvalidArgumentError as err:  # a value the graph refuses (TF Serving: INVALID_ARGUMENT)
            raise input_rejected("TensorFlow", inputs, err.message) from err
        except tf.errors.UnimplementedError as err:  # an op this TensorFlow build cannot run (TF Serving passes
            # TensorFlow's code on: UNIMPLEMENTED, REST 501), e.g. a fused grouped convolution without oneDNN
            raise UnimplementedError(f"TensorFlow cannot run signature '{signature_name}' of this model on this "
                                     f"host: {tensorflow_failure(err.message)}") from err
        except (tf.errors.InternalError, tf.errors.UnknownError):
            raise  # a server fault: INTERNAL with an incident (or the client's, on an input off the signature)
        except tf.errors.OpError as err:  # the model's own status (NotFound, OutOfRange, ...): its code, as TF Serving
            code = GRPC_CODE_NAMES[err.error_code] if 0 <= err.error_code < len(GRPC_CODE_NAMES) else "UNKNOWN"
            raise ModelError(f"signature '{signature_name}' failed in the model: {type(err).__name__}: "
                             f"{tensorflow_failure(err.message)}", code) from err

    def metadata(self) -> dict[str, Signature]:
        return dict(self._signatures)

    def unload(self) -> None:
        if self._session is not None:
            self._session.close()
        self._session = None
        super().unload()

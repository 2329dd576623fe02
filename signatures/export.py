"""Export stage: a forward-only `tf.Module` with fixed `input_signature`s, saved as a SavedModel.

The module tracks only the model's weights (no optimizer, no step counter) and its serving
function calls the model with `training=False`. The function is traced without `jit_compile`, so
the SavedModel runs on servers with XLA off (TensorFlow Serving's default).
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from core.errors import ContractError
from signatures.contract import SignatureContract, TensorContract, compare_contracts


@dataclass(frozen=True)
class ExportResult:
    """Where the SavedModel was written and the contract read back from its `signature_def`."""

    saved_model_dir: Path
    contract: SignatureContract


def _tf_dtype_name(dtype) -> str:
    return "string" if dtype.name == "string" else dtype.name


def build_classifier_module(model, contract: SignatureContract):
    """Wrap a Keras classifier returning logits [B, C] into a `tf.Module` with a serving function.

    The function maps the contract's single input to `{"logits", "probabilities", "class_id"}`:
    float32 [B, C], float32 [B, C] (softmax) and int64 [B] (argmax).
    """
    import tensorflow as tf

    (image,) = contract.inputs
    spec = tf.TensorSpec([None if d is None else d for d in image.shape], tf.as_dtype(image.dtype), name=image.name)

    def serve(tensor):
        logits = tf.cast(model(tensor, training=False), tf.float32)
        return {
            "logits": tf.identity(logits, name="logits"),
            "probabilities": tf.nn.softmax(logits, axis=-1, name="probabilities"),
            "class_id": tf.argmax(logits, axis=-1, output_type=tf.int64, name="class_id"),
        }

    module = tf.Module(name="serving")
    # Track the backing tf.Variables, not Keras' wrappers: saving a Keras 3 variable wrapper adds a
    # top-level initializer that assigns it, and the TFLite converter then refuses to freeze it
    # (it writes an artifact that reads uninitialised variables and returns NaN).
    module.model_weights = [getattr(weight, "value", weight) for weight in model.weights]
    module.serving_default = tf.function(serve, input_signature=[spec], jit_compile=False, autograph=False)
    return module


SERVE_TAGS = ("serve",)


def select_meta_graph(proto, tags: tuple[str, ...] = SERVE_TAGS, where: str = "SavedModel"):
    """The MetaGraph whose tag-set is exactly `tags` (TensorFlow's and TF Serving's rule; default `serve`).

    A SavedModel with one MetaGraph that carries `serve` among its tags is accepted for the default too.
    TF1 / Estimator exports hold several (`serve`, `train`, `eval`); the `serve` one is what servers load.

    Raises:
        ContractError: no MetaGraph has that tag-set; the message lists the tag-sets present and `--tags`.
    """
    wanted = set(tags)
    for graph in proto.meta_graphs:
        if set(graph.meta_info_def.tags) == wanted:
            return graph
    if tuple(tags) == SERVE_TAGS and len(proto.meta_graphs) == 1 and "serve" in proto.meta_graphs[0].meta_info_def.tags:
        return proto.meta_graphs[0]
    present = [sorted(g.meta_info_def.tags) for g in proto.meta_graphs]
    raise ContractError(f"{where}: no MetaGraph tagged {sorted(wanted)}; it has tag-sets {present}; "
                        "choose one with --tags (e.g. --tags serve,gpu)")


def read_signature_contracts(saved_model_dir: Path, tags: tuple[str, ...] = SERVE_TAGS) -> dict[str, SignatureContract]:
    """Read every `signature_def` of a SavedModel's MetaGraph tagged `tags` into contracts (no TF load).

    TensorFlow's internal `__saved_model_init_op` entry is not a serving signature and is skipped.

    Raises:
        ContractError: when the directory holds no readable `saved_model.pb` with a MetaGraph tagged `tags`.
    """
    from tensorflow.core.protobuf import saved_model_pb2
    import tensorflow as tf

    path = Path(saved_model_dir) / "saved_model.pb"
    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString(path.read_bytes())
    except (OSError, Exception) as err:  # noqa: BLE001 - protobuf raises its own DecodeError
        raise ContractError(f"{path}: cannot read SavedModel: {err}") from err
    graph = select_meta_graph(proto, tags, str(path))

    def tensors(mapping) -> tuple[TensorContract, ...]:
        out = []
        for key, info in mapping.items():
            dims = () if info.tensor_shape.unknown_rank else tuple(
                None if d.size < 0 else d.size for d in info.tensor_shape.dim)
            out.append(TensorContract(key, _tf_dtype_name(tf.as_dtype(info.dtype)), dims))
        return tuple(out)

    return {name: SignatureContract(name, tensors(sig.inputs), tensors(sig.outputs))
            for name, sig in graph.signature_def.items() if not name.startswith("__")}


def export_saved_model(module, contract: SignatureContract, export_dir: Path,
                       extra_contracts: tuple[SignatureContract, ...] = ()) -> ExportResult:
    """Save `module` to `export_dir` and prove every signature it declares.

    `module` comes from `build_classifier_module` or `signatures.keras_export.build_keras_module`: it holds
    one tf.function per signature name (`module.signature_names`, else just `contract.name`).
    Written into a temporary sibling folder and renamed into place, so a failed export leaves no
    partial directory. Each written `signature_def` is read back and compared with its contract
    (`contract` for `serving_default`, `extra_contracts` for the others); no other signature may exist.

    Raises:
        ContractError: a written signature's keys, dtypes or ranks differ from its contract, a declared
            signature is missing, or an undeclared one was written.
    """
    import tensorflow as tf

    export_dir = Path(export_dir)
    export_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = export_dir.with_name(f".{export_dir.name}.{secrets.token_hex(4)}.tmp")
    try:
        names = tuple(getattr(module, "signature_names", (contract.name,)))
        tf.saved_model.save(module, str(staging), signatures={name: getattr(module, name) for name in names},
                            options=tf.saved_model.SaveOptions(save_debug_info=False))
        written = read_signature_contracts(staging)
        declared = {c.name: c for c in (contract, *extra_contracts)}
        if set(written) != set(declared):
            raise ContractError(f"{export_dir}: signatures written {sorted(written)}, declared {sorted(declared)}")
        for name, expected in declared.items():
            compare_contracts(expected, written[name], f"{export_dir}/saved_model.pb")
        if export_dir.exists():
            shutil.rmtree(export_dir)
        os.replace(staging, export_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(export_dir, contract)


def build_savedmodel_module(saved_model_dir: Path, contract: SignatureContract, tags: tuple[str, ...] | None = None):
    """Re-export an existing SavedModel's signature through a forward-only module.

    The source is loaded with `tf.saved_model.load` (the MetaGraph tagged `tags`, default `serve`); the
    new `serving_default` calls its signature function with the contract's inputs and returns the
    contract's outputs by name. Like Keras' own export (`saved_model_export_archive`,
    `_filter_and_track_resources`), the module tracks only the variables the traced function captures and
    the source's resources (lookup tables) and asset files, nothing else: optimizer slots, step counters
    and other training state the user's module still holds are left behind, and the audit then judges
    what is left. `module.dropped_variables` names the source variables that were not kept.
    """
    import tensorflow as tf

    loaded = tf.saved_model.load(str(saved_model_dir), tags=list(tags) if tags else None)
    function = loaded.signatures[contract.name]
    kept, dropped, resources = _reachable_state(loaded, function)
    specs = {t.name: tf.TensorSpec([None if d is None else d for d in t.shape], tf.as_dtype(t.dtype), name=t.name)
             for t in contract.inputs}

    def serve(feed):
        result = function(**feed)
        return {t.name: tf.identity(result[t.name]) for t in contract.outputs}

    module = tf.Module(name="serving")
    module.kept_variables = kept
    module.resources = resources
    module.dropped_variables = tuple(v.name for v in dropped)
    setattr(module, contract.name, tf.function(serve, input_signature=[specs], autograph=False))
    module.signature_names = (contract.name,)
    return module


def _reachable_state(root, function) -> tuple[list, list, list]:
    """(variables `function`'s outputs depend on, the other variables under `root`, resources + assets).

    Capture lists over-state use (a TF1 signature is a pruned function that captures every variable of its
    MetaGraph, optimizer slots included), so the graph is walked from the outputs (`signatures.reachable`)
    and only the captures reached count. The handles of the others are swapped for a kept variable's handle
    in `function`'s captured inputs (`ConcreteFunction.set_external_captures`): the function never reads
    them, and a function that captures an untracked variable cannot be saved.
    """
    import tensorflow as tf
    from tensorflow.saved_model.experimental import TrackableResource

    from signatures.reachable import used_placeholders

    captures = list(function.captured_inputs)
    placeholders = [t.op.name for t in function.graph.internal_captures]
    outputs = [t.name for t in function.outputs] + [op.name for op in function.graph.control_outputs]
    used = used_placeholders(function.graph.as_graph_def(), outputs, set(placeholders))
    used_ids = {id(c) for c, p in zip(captures, placeholders, strict=True) if p in used}
    kept, dropped, resources, seen = [], [], [], set()
    for trackable in tf.train.TrackableView(root).descendants():
        if id(trackable) in seen:
            continue
        seen.add(id(trackable))
        if isinstance(trackable, tf.Variable):
            (kept if id(trackable.handle) in used_ids else dropped).append(trackable)
        elif isinstance(trackable, (TrackableResource, tf.saved_model.Asset)):
            resources.append(trackable)
    unused = {id(v.handle) for v in dropped} & {id(c) for c in captures}
    if unused:
        stand_in = kept[0].handle if kept else tf.Variable(0.0, trainable=False, name="unused_capture").handle
        if not kept:
            kept.append(stand_in)
        function.set_external_captures([stand_in if id(c) in unused else c for c in captures])
    return kept, dropped, resources

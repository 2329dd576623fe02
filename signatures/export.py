"""Export stage: a forward-only `tf.Module` with fixed `input_signature`s, saved as a SavedModel.

The module tracks only the model's weights (no optimizer, no step counter) and its serving
function calls the model with `training=False`. The function is traced without `jit_compile`, and after
saving, `signatures.forward_only` removes the library functions nothing reaches (custom-gradient backward
functions) and the must-compile marks of inner `tf.function(jit_compile=True)`s, so the SavedModel runs on
servers with XLA off (TensorFlow Serving's default).
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tfship.core.contract import DEFAULT_SIGNATURE, Signature, TensorSpec, compare_contracts
from tfship.core.errors import ContractError
from tfship.core.saved_model import read_signatures
from tfship.signatures.forward_only import LibraryCleanup, forward_only_library

if TYPE_CHECKING:
    from tfship.signatures.serving_module import ServingModule


@dataclass(frozen=True)
class ExportResult:
    """Where the SavedModel was written, the contract read back from its `signature_def`, every signature
    written ({name: contract}) and what `signatures.forward_only` removed from the function library.
    """

    saved_model_dir: Path
    contract: Signature
    signatures: dict[str, Signature] = field(default_factory=dict)
    cleanup: LibraryCleanup = field(default_factory=LibraryCleanup)


def classifier_contract(input_name: str, input_shape: tuple[int, ...], num_classes: int,
                        input_dtype: str = "float32") -> Signature:
    """The built-in classifier contract.

    Input `<input_name>` `input_dtype` (float32 unless the model declares e.g. int32 token ids)
    [-1, *input_shape]; outputs `logits` float32 [-1, num_classes], `probabilities` float32
    [-1, num_classes], `class_id` int64 [-1].
    """
    return Signature.of(
        DEFAULT_SIGNATURE,
        inputs=(TensorSpec(name=input_name, dtype=input_dtype, shape=(None, *input_shape)),),
        outputs=(
            TensorSpec(name="logits", dtype="float32", shape=(None, num_classes)),
            TensorSpec(name="probabilities", dtype="float32", shape=(None, num_classes)),
            TensorSpec(name="class_id", dtype="int64", shape=(None,)),
        ),
    )


def tf_tensor_spec(spec: TensorSpec):
    """`tf.TensorSpec` of a contract spec (unknown rank stays unknown, a scalar stays a scalar)."""
    import tensorflow as tf

    shape = None if spec.shape is None else list(spec.shape)
    return tf.TensorSpec(shape, tf.as_dtype(spec.dtype), name=spec.name)  # pyright: ignore[reportArgumentType]  # tf stub: shape None (unknown rank) is valid


def build_classifier_module(model, contract: Signature) -> ServingModule:
    """Wrap a Keras classifier returning logits [B, C] into a `tf.Module` with a serving function.

    The function maps the contract's single input to `{"logits", "probabilities", "class_id"}`:
    float32 [B, C], float32 [B, C] (softmax) and int64 [B] (argmax).
    """
    import tensorflow as tf

    (image,) = contract.inputs.values()
    spec = tf_tensor_spec(image)

    def serve(tensor):
        logits = tf.cast(model(tensor, training=False), tf.float32)
        return {
            "logits": tf.identity(logits, name="logits"),
            "probabilities": tf.nn.softmax(logits, axis=-1, name="probabilities"),
            "class_id": tf.argmax(logits, axis=-1, output_type=tf.int64, name="class_id"),
        }

    from tfship.signatures.serving_module import ServingModule

    module = ServingModule(name="serving")
    # Track the backing tf.Variables, not Keras' wrappers: saving a Keras 3 variable wrapper adds a
    # top-level initializer that assigns it, and the TFLite converter then refuses to freeze it
    # (it writes an artifact that reads uninitialised variables and returns NaN).
    module.model_weights = [getattr(weight, "value", weight) for weight in model.weights]
    module.serving_default = tf.function(serve, input_signature=[spec], jit_compile=False, autograph=False)
    return module


def export_saved_model(module, contract: Signature, export_dir: Path,
                       extra_contracts: tuple[Signature, ...] = ()) -> ExportResult:
    """Save `module` to `export_dir` and prove every signature it declares.

    `module` comes from `build_classifier_module` or `signatures.keras_export.build_keras_module`: it holds
    one tf.function per signature name (`module.signature_names`, else just `contract.name`).
    Written into a temporary sibling folder and renamed into place, so a failed export leaves no
    partial directory. Saved without custom gradients (`experimental_custom_gradients=False`), then the
    library is cut to what the signatures, the saver and the object graph reach, and must-compile marks are
    removed (`signatures.forward_only.forward_only_library`). Each written `signature_def` is read back and
    compared with its contract (`contract` for `serving_default`, `extra_contracts` for the others); no other
    signature may exist.

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
                            options=tf.saved_model.SaveOptions(save_debug_info=False,
                                                               experimental_custom_gradients=False))
        cleanup = forward_only_library(staging)
        written = read_signatures(staging)
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
    return ExportResult(export_dir, contract, written, cleanup)


def build_savedmodel_module(saved_model_dir: Path, contract: Signature, tags: tuple[str, ...] | None = None,
                            extra_contracts: tuple[Signature, ...] = ()) -> ServingModule:
    """Re-export an existing SavedModel's signatures through a forward-only module.

    The source is loaded with `tf.saved_model.load` (the MetaGraph tagged `tags`, default `serve`); for
    `contract` (`serving_default`) and each of `extra_contracts` (the source's other signatures: TF Serving
    serves every one) the new module holds a function that calls the source's signature of that name with
    the contract's inputs and returns its outputs by name. Like Keras' own export
    (`saved_model_export_archive`, `_filter_and_track_resources`), the module tracks only the variables the
    traced functions capture and the source's resources (lookup tables) and asset files, nothing else:
    optimizer slots, step counters and other training state the user's module still holds are left behind,
    and the audit then judges what is left. `module.dropped_variables` names the source variables that no
    signature uses; `module.signature_names` lists the signatures, `contract.name` first.

    Raises:
        ContractError: a contract names a signature the source lacks.
    """
    import tensorflow as tf

    loaded = tf.saved_model.load(str(saved_model_dir), tags=list(tags) if tags else None)
    contracts = (contract, *extra_contracts)
    missing = [c.name for c in contracts if c.name not in loaded.signatures]
    if missing:
        raise ContractError(f"{saved_model_dir}: no signature {missing}; it has {sorted(loaded.signatures)}")
    functions = {c.name: loaded.signatures[c.name] for c in contracts}
    kept, dropped, resources = _reachable_state(loaded, list(functions.values()))
    from tfship.signatures.serving_module import ServingModule

    module = ServingModule(name="serving")
    module.kept_variables = kept
    module.resources = resources
    module.dropped_variables = tuple(v.name for v in dropped)
    for signature in contracts:
        setattr(module, signature.name, _forwarding_function(functions[signature.name], signature))
    module.signature_names = tuple(c.name for c in contracts)
    return module


def _forwarding_function(function, contract: Signature):
    """A tf.function with `contract`'s inputs that calls `function` and returns `contract`'s outputs by name."""
    import tensorflow as tf

    specs = {t.name: tf_tensor_spec(t) for t in contract.inputs.values()}

    def serve(feed):
        result = function(**feed)
        return {name: tf.identity(result[name]) for name in contract.outputs}

    return tf.function(serve, input_signature=[specs], autograph=False, jit_compile=False)


def _reachable_state(root, functions: list) -> tuple[list, list, list]:
    """(variables any of `functions`' outputs depend on, the other variables under `root`, resources + assets).

    Capture lists over-state use (a TF1 signature is a pruned function that captures every variable of its
    MetaGraph, optimizer slots included), so each function's graph is walked from its outputs
    (`signatures.reachable`) and only the captures reached count. In each function's captured inputs the
    handles of variables no function uses are swapped for a kept variable's handle
    (`ConcreteFunction.set_external_captures`): the function never reads them, and a function that captures
    an untracked variable cannot be saved.
    """
    import tensorflow as tf
    from tensorflow.saved_model.experimental import TrackableResource

    from tfship.signatures.reachable import used_placeholders

    used_ids: set[int] = set()
    for function in functions:
        captures = list(function.captured_inputs)
        placeholders = [t.op.name for t in function.graph.internal_captures]
        outputs = [t.name for t in function.outputs] + [op.name for op in function.graph.control_outputs]
        used = used_placeholders(function.graph.as_graph_def(), outputs, set(placeholders))
        used_ids |= {id(c) for c, p in zip(captures, placeholders, strict=True) if p in used}
    kept, dropped, resources, seen = [], [], [], set()
    for trackable in tf.train.TrackableView(root).descendants():
        if id(trackable) in seen:
            continue
        seen.add(id(trackable))
        if isinstance(trackable, tf.Variable):
            (kept if id(trackable.handle) in used_ids else dropped).append(trackable)
        elif isinstance(trackable, (TrackableResource, tf.saved_model.Asset)):
            resources.append(trackable)
    dropped_ids = {id(v.handle) for v in dropped}
    stand_in = None
    for function in functions:
        captures = list(function.captured_inputs)
        if not dropped_ids & {id(c) for c in captures}:
            continue
        if stand_in is None:
            stand_in = kept[0].handle if kept else tf.Variable(tf.constant(0.0), trainable=False,
                                                               name="unused_capture").handle
            if not kept:
                kept.append(stand_in)
        function.set_external_captures([stand_in if id(c) in dropped_ids else c for c in captures])
    return kept, dropped, resources

"""Export any functional Keras model: a contract read from the model, a float32 copy of mixed-precision
models, and a forward-only `tf.Module` whose signatures return a dict keyed by the contract's names.

Follows Keras' own SavedModel export (`keras/src/export/saved_model_export_archive.py`): each endpoint calls
the model with `training=False` under an explicit `input_signature`, only the variables the traced functions
capture are saved (the backing `tf.Variable`s, never Keras wrappers: see `signatures.export`), and lookup
tables (`StringLookup`, `IntegerLookup`, ...) are tracked so the SavedModel can restore them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tfship.core.contract import DEFAULT_SIGNATURE, Signature, TensorSpec
from tfship.core.errors import ContractError

if TYPE_CHECKING:
    from tfship.signatures.serving_module import ServingModule

LOW_PRECISION = ("float16", "bfloat16")
_OP_NAME = re.compile(r"[^A-Za-z0-9_.\-/]")


def _dtype_name(dtype) -> str:
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", str(dtype))
    return "float32" if name in LOW_PRECISION else name


def _dict_head(model) -> Mapping | None:
    """The model's dict of outputs, or None for a list/single head.

    Keras 3 raises from `Sequential.output` even when `Sequential.outputs` is defined, so the
    error only means "not a dict head" here; `model.outputs` decides whether the model is symbolic.
    """
    try:
        output = model.output
    except (AttributeError, ValueError):
        return None
    return output if isinstance(output, Mapping) else None


def _output_names(model) -> list[str]:
    head = _dict_head(model)
    if head is not None:
        return [str(key) for key in head]
    names: list[str] = []
    for tensor in model.outputs:
        history = getattr(tensor, "_keras_history", None)
        base = history.operation.name if history is not None else f"output_{len(names)}"
        name, index = base, 1
        while name in names:
            name, index = f"{base}_{index}", index + 1
        names.append(name)
    return names


def _flat_outputs(model) -> list:
    head = _dict_head(model)
    return list(head.values()) if head is not None else list(model.outputs)


def contract_from_keras(model, name: str = DEFAULT_SIGNATURE) -> Signature:
    """The default contract of a functional Keras model: its `Input` names and its output names.

    Inputs: one per `keras.Input`, named after it, dtype as declared (`string` for tf.string), shape
    `[-1, ...]`. Outputs: the keys of a dict head, else the name of the layer producing each output
    (a second output of the same layer gets `_1`, ...). float16 / bfloat16 tensors are declared float32:
    the exported signature casts them (a DT_HALF or DT_BFLOAT16 signature is never written).

    Raises:
        ContractError: the model has no symbolic inputs/outputs (a subclassed model that was never built
            from `keras.Input`), or two inputs share a name.
    """
    try:
        inputs, outputs = list(model.inputs), _flat_outputs(model)
    except (AttributeError, ValueError) as err:
        raise ContractError(f"model '{model.name}' has no symbolic inputs/outputs ({err}); export needs a "
                            "functional or Sequential model built on keras.Input") from err
    input_names = [t.name for t in inputs]
    if len(set(input_names)) != len(input_names):
        raise ContractError(f"model '{model.name}' has duplicate input names {input_names}; name each keras.Input")
    return Signature.of(
        name,
        (TensorSpec(name=t.name, dtype=_dtype_name(t.dtype), shape=(None, *t.shape[1:])) for t in inputs),
        (TensorSpec(name=n, dtype=_dtype_name(t.dtype), shape=(None, *t.shape[1:]))
         for n, t in zip(_output_names(model), outputs)),
    )


def low_precision_layers(model) -> dict[str, str]:
    """{layer name: dtype policy name} for every layer computing or storing in float16 / bfloat16."""
    found = {}
    for layer in model._flatten_layers(include_self=False):
        policy = getattr(layer, "dtype_policy", None)
        names = (getattr(policy, "name", ""), getattr(policy, "compute_dtype", ""),
                 getattr(policy, "variable_dtype", ""))
        if any(n in LOW_PRECISION or "float16" in str(n) for n in names):
            found[layer.name] = str(getattr(policy, "name", policy))
    return found


def float32_copy(model):
    """Return `model` itself when it is all float32, else a float32 clone with the weights cast.

    The clone (`keras.models.clone_model`, every layer rebuilt from its config with `dtype="float32"`)
    computes in float32, so the exported signature is float32 in and out and the parity gate compares the
    artifacts with what is served.

    Raises:
        ContractError: naming the low-precision policies, when the model cannot be cloned (custom layers
            without `get_config`) or its weights do not fit the clone; set the dtype policy to float32
            before saving the model, or register the custom objects.
    """
    import keras
    import numpy as np

    policies = low_precision_layers(model)
    low_inputs = [t.name for t in model.inputs if _dtype_name(t.dtype) != getattr(t.dtype, "name", t.dtype)]
    if not policies and not low_inputs:
        return model

    def rebuild(layer):
        if isinstance(layer, keras.layers.InputLayer):
            return layer
        return layer.__class__.from_config({**layer.get_config(), "dtype": "float32"})

    named = ", ".join(f"{k}: {v}" for k, v in sorted(policies.items())[:8])
    try:
        clone = keras.models.clone_model(model, clone_function=rebuild)
        for target, source in zip(clone.weights, model.weights, strict=True):
            value = np.asarray(keras.ops.convert_to_numpy(source.value))
            target.assign(value.astype(target.dtype) if value.dtype.kind == "f" else value)
    except Exception as err:
        raise ContractError(f"model '{model.name}' uses low-precision dtype policies ({named}); tfship exports a "
                            f"float32 copy but could not build it: {type(err).__name__}: {err}. Set the policy to "
                            "'float32' before saving, or register the custom layers") from err
    still = low_precision_layers(clone)
    if still:
        raise ContractError(f"float32 copy of '{model.name}' still has low-precision layers {still}")
    return clone


def _tracked_resources(model) -> list:
    from tensorflow.saved_model.experimental import TrackableResource

    found, seen = [], set()
    for layer in model._flatten_layers(include_self=True):
        for value in vars(layer).values():
            for item in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(item, TrackableResource) and id(item) not in seen:
                    seen.add(id(item))
                    found.append(item)
    return found


def signature_functions(model, contract: Signature,
                        extra: Mapping[str, tuple[str, ...]] | None = None) -> dict:
    """{signature name: tf.function} for `contract` and each extra signature (a subset of its outputs).

    Every function takes one tensor per contract input (dict keyed by input name, batch dim -1), calls the
    model with `training=False`, casts low-precision float outputs to float32 and returns {name: tensor}.

    Raises:
        ContractError: an extra signature names an output the contract lacks, or is called `serving_default`.
    """
    import keras
    import tensorflow as tf

    from tfship.signatures.export import tf_tensor_spec

    specs = {t.name: tf_tensor_spec(t) for t in contract.inputs.values()}
    model_inputs = {t.name: t for t in model.inputs}
    names = contract.output_names()

    def outputs_of(feed):
        fed = {k: tf.cast(v, model_inputs[k].dtype) if v.dtype.is_floating else v for k, v in feed.items()}
        # A Sequential model has no `.input` structure (Keras 3: "never been called"): its one input tensor.
        structure = model.inputs[0] if isinstance(model, keras.Sequential) else model.input
        result = model(keras.tree.map_structure(lambda t: fed[t.name], structure), training=False)
        flat = list(result.values()) if isinstance(result, Mapping) else list(result) if isinstance(
            result, (list, tuple)) else [result]
        out = {}
        for name, tensor in zip(names, flat, strict=True):
            tensor = tf.cast(tensor, tf.float32) if tensor.dtype in (tf.float16, tf.bfloat16) else tensor
            out[name] = tf.identity(tensor, name=_OP_NAME.sub("_", name))
        return out

    functions = {contract.name: tf.function(outputs_of, input_signature=[specs], autograph=False,
                                            jit_compile=False)}
    for signature, subset in (extra or {}).items():
        unknown = [n for n in subset if n not in names]
        if unknown or signature == contract.name or not subset:
            raise ContractError(f"extra signature '{signature}': outputs {list(subset)} must be a non-empty "
                                f"subset of {list(names)} (unknown {unknown}) and not named '{contract.name}'")
        functions[signature] = tf.function(lambda feed, keep=tuple(subset): {k: v for k, v in outputs_of(feed).items()
                                                                           if k in keep},
                                           input_signature=[specs], autograph=False, jit_compile=False)
    return functions


def build_keras_module(model, contract: Signature,
                       extra: Mapping[str, tuple[str, ...]] | None = None) -> ServingModule:
    """A `tf.Module` with one attribute per signature (see `signature_functions`) for `export_saved_model`.

    The module tracks exactly the variables the traced functions capture (the backing `tf.Variable`s) and
    the lookup-table resources of the model's layers. `module.signature_names` lists the signatures.
    """
    functions = signature_functions(model, contract, extra)
    captured, seen = [], set()
    for function in functions.values():
        for variable in function.get_concrete_function().variables:
            if id(variable) not in seen:
                seen.add(id(variable))
                captured.append(variable)
    from tfship.signatures.serving_module import ServingModule

    module = ServingModule(name="serving")
    module.model_weights = [getattr(w, "value", w) for w in model.weights]
    module.captured_variables = captured
    module.lookup_resources = _tracked_resources(model)
    for name, function in functions.items():
        setattr(module, name, function)
    module.signature_names = tuple(functions)
    return module


def extra_contract(contract: Signature, name: str, outputs: tuple[str, ...]) -> Signature:
    """The contract of an extra signature: same inputs, the named subset of outputs."""
    return Signature.of(name, contract.inputs.values(), (contract.outputs[n] for n in outputs))

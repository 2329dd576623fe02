"""The SavedModel's graph evaluated in float64: the truth a float32 implementation's rounding error is
measured against (`pipeline.gate.noise.implementation_noise`).

The signature's concrete function is frozen (variables become constants, TensorFlow's
`convert_variables_to_constants_v2`), then every float32 type attribute and float32 constant of the graph
(and of its function library) is widened to float64; integer, string and other float types (float16,
bfloat16 of a mixed-precision model) stay as they are. Float32 inputs are fed widened, so the float64 graph
sees exactly the values the float32 one saw. A graph with an op that has no float64 kernel (e.g.
`FusedBatchNormV3`), a resource it cannot freeze (lookup tables) or a graph too large to hold as one
protobuf is not evaluated: `float64_outputs` returns (None, why) and the float32 bound falls back to
`validate.float32.atol`/`rtol` plus the batch noise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["float64_outputs"]


def _widen(graph_def) -> None:
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    nodes = list(graph_def.node) + [node for function in graph_def.library.function for node in function.node_def]
    for node in nodes:
        for attr in node.attr.values():
            if attr.type == types_pb2.DT_FLOAT:
                attr.type = types_pb2.DT_DOUBLE
            if attr.HasField("list") and attr.list.type:
                attr.list.type[:] = [types_pb2.DT_DOUBLE if t == types_pb2.DT_FLOAT else t for t in attr.list.type]
            if attr.HasField("tensor") and attr.tensor.dtype == types_pb2.DT_FLOAT:
                attr.tensor.CopyFrom(tf.make_tensor_proto(tf.make_ndarray(attr.tensor).astype(np.float64)))
    for function in graph_def.library.function:
        for arg in (*function.signature.input_arg, *function.signature.output_arg):
            if arg.type == types_pb2.DT_FLOAT:
                arg.type = types_pb2.DT_DOUBLE


def _widened_function(saved_model_dir: Path, signature: str):
    """(callable of the float64 graph taking the flattened inputs, input names, output names, the loaded
    SavedModel to keep alive).
    """
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    loaded = tf.saved_model.load(str(saved_model_dir))
    function = loaded.signatures[signature]
    frozen = convert_variables_to_constants_v2(function)
    graph_def = frozen.graph.as_graph_def()
    _widen(graph_def)
    _, kwargs = function.structured_input_signature
    input_names = sorted(kwargs)  # the flattened order of a dict: its sorted keys
    outputs = function.structured_outputs  # the frozen copy flattens them: a dict flattens in sorted key order
    output_names = sorted(outputs) if isinstance(outputs, dict) else [f"output_{i}" for i in range(len(outputs))]
    wrapped = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(graph_def, name=""), [])
    pruned = wrapped.prune([wrapped.graph.get_tensor_by_name(t.name) for t in frozen.inputs],
                           [wrapped.graph.get_tensor_by_name(t.name) for t in frozen.outputs])
    return pruned, input_names, output_names, loaded


def float64_outputs(saved_model_dir: Path, inputs: dict[str, np.ndarray], batch_size: int,
                    signature: str = "serving_default") -> tuple[dict[str, np.ndarray] | None, str]:
    """The signature's outputs computed in float64 on `inputs` (all [N, ...], the signature's input names).

    Args:
        saved_model_dir: the SavedModel folder.
        inputs: {input name: [N, ...]} in the signature's dtypes (float32 ones are widened exactly).
        batch_size: rows per call.

    Returns:
        ({output name: [N, ...] float64 (float outputs) or as computed (others)}, "") or (None, why not).
    """
    import tensorflow as tf

    try:
        function, input_names, output_names, _loaded = _widened_function(saved_model_dir, signature)
        total = len(next(iter(inputs.values())))
        chunks: dict[str, list[np.ndarray]] = {name: [] for name in output_names}
        for start in range(0, total, batch_size):
            feed = [np.asarray(inputs[name][start:start + batch_size]) for name in input_names]
            feed = [value.astype(np.float64) if value.dtype == np.float32 else value for value in feed]
            for name, value in zip(output_names, function(*[tf.constant(v) for v in feed]), strict=True):
                chunks[name].append(value.numpy())
        return {name: np.concatenate(parts, axis=0) for name, parts in chunks.items()}, ""
    except Exception as err:  # noqa: BLE001 - any graph the widening cannot run is "not measured", with why
        text = " ".join(str(err).split())
        return None, f"the graph does not run in float64: {type(err).__name__}: {text[:200]}"

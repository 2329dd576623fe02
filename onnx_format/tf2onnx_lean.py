"""`python -m tfship.onnx_format.tf2onnx_lean ARGS`: tf2onnx's own command line, in bounded memory.

Run only in the ONNX converter's child process (`onnx_format.convert`); the arguments are
tf2onnx's (`python -m tf2onnx.convert --help`) and its unchanged `main()` does the conversion. Three
things differ, none of them in what is written (the `.onnx` file is byte-identical to plain tf2onnx's,
checked on ResNet50 and in tests/pipeline/test_onnx_memory.py), and one op is added (4.):

1. Freezing copies the weights once. tf2onnx 1.17 freezes with `convert_variables_to_constants_v2`, which
   builds a whole new concrete function from the frozen graph only to export it again with `as_graph_def`
   (two more copies of every weight, then a third imported into a session). Here the frozen GraphDef is
   taken from the same freezing step tf2onnx's own large-model path uses
   (`convert_variables_to_constants_large_model`) and handed to tf2onnx's unchanged grappler pass
   (`tf_optimize`, which also annotates the output shapes tf2onnx reads).
2. The ONNX optimizer loop shares constant tensors between its rollback copies. `optimize_graph`
   deep-copies the whole graph before each of its 12 optimizers, every iteration, so that a failing
   optimizer can be undone; each copy held every weight again, and the discarded copies are cycles
   (nodes point at their graph) that only a full garbage collection frees. Constants are never changed
   in place there (`Node.set_tensor_value` and every optimizer replace the `value` attribute), so the
   copies share them, and the previous copy is collected before the next is made.
3. `numpy.product` (removed in NumPy 2.0, still called by tf2onnx's `--large_model` path) is provided as
   NumPy's documented replacement `numpy.prod` when it is missing.
4. TensorFlow's `Erfc` (the complementary error function; exact GELU, `keras.activations.gelu(approximate=False)`,
   as in ConvNeXt, lowers to it) has no tf2onnx 1.17 handler, so such a model failed with "tf2onnx left
   unconverted TensorFlow ops: Erfc". ONNX has no Erfc either; it is written as `1 - Erf(x)` (ONNX `Erf`,
   opset 9 on), registered through tf2onnx's own handler decorator (`tf2onnx.handler.tf_op`). In float32 that
   costs absolute error, never relative: erfc(x) < 6e-8 (x > 3.9) comes back as 0, so GELU's
   `0.5 * x * erfc(-x / sqrt(2))` is off by at most |x| * 3e-8 there (tests/pipeline/test_onnx_erfc.py).

ResNet50 (98 MB of weights): peak RSS 5.5 GB with plain tf2onnx, 2.6 GB here (0.7 GB of it is importing
TensorFlow); docs/benchmarks.md has the figures per model size.
"""

from __future__ import annotations

import copy
import gc

import numpy as np

if not hasattr(np, "product"):
    np.product = np.prod  # pyright: ignore[reportAttributeAccessIssue]  # NumPy < 2's name, gone from NumPy 2's stubs


def _nodes(graph):
    """Every node of a tf2onnx `Graph`, those of its subgraphs (loop and branch bodies) included."""
    for node in graph.get_nodes():
        yield node
        for body in (node.get_body_graphs() or {}).values():
            yield from _nodes(body)


class _SharedConstantCopy:
    """Stands in for the `copy` module inside `tf2onnx.optimizer`: `deepcopy(graph)` shares constant values."""

    @staticmethod
    def deepcopy(value, memo=None):
        from onnx import AttributeProto
        from tf2onnx.graph import Graph

        memo = {} if memo is None else memo
        if isinstance(value, Graph):
            gc.collect()  # the copy the previous optimizer left behind (a reference cycle)
            for node in _nodes(value):
                attribute = node.attr.get("value")
                if attribute is not None and attribute.type == AttributeProto.TENSOR:
                    memo[id(attribute)] = attribute  # deepcopy's memo: "already copied, as itself"
        return copy.deepcopy(value, memo)


def _freeze_once(func, input_names, output_names, large_model=False):
    """tf2onnx's `tf_loader.from_function`, freezing through the one-copy path (see the module docstring)."""
    import tensorflow as tf
    from tf2onnx import tf_loader

    graph_def = tf_loader.convert_variables_to_constants_large_model(func)
    if large_model:
        return graph_def
    graph_def = tf_loader.fix_freezing_errors_part2(graph_def)
    with tf.Graph().as_default() as tf_graph, tf_loader.tf_session(graph=tf_graph) as session:
        tf.import_graph_def(graph_def, name="")
        input_names = tf_loader.inputs_without_resource(session, input_names)
        return tf_loader.tf_optimize(input_names, output_names, graph_def)


def _erfc_as_one_minus_erf(ctx, node, **kwargs):
    """tf2onnx handler (opset 9 on) for TensorFlow's `Erfc` (x: float [...] -> erfc(x), same shape and dtype):
    the node becomes ONNX `Erf` and `1 - Erf(x)` takes its output's consumers (module docstring, 4.).
    """
    from tf2onnx import utils

    dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
    one = ctx.make_const(utils.make_name(f"{node.name}/one"), np.array(1, dtype=dtype))
    node.type = "Erf"
    complement = ctx.insert_new_node_on_output("Sub", node.output[0], name=utils.make_name(f"{node.name}/erfc"),
                                               inputs=[one.output[0], node.output[0]])
    ctx.copy_shape(node.output[0], complement.output[0])
    ctx.set_dtype(complement.output[0], ctx.get_dtype(node.output[0]))


class _Erfc:
    """`Erfc`'s handler class as tf2onnx's decorator reads it: `version_<opset>` classmethods."""

    @classmethod
    def version_9(cls, ctx, node, **kwargs):
        _erfc_as_one_minus_erf(ctx, node, **kwargs)


def install() -> None:
    """Put the replacements and the `Erfc` handler in place inside tf2onnx (this process only)."""
    import tf2onnx.optimizer
    from tf2onnx import tf_loader
    from tf2onnx.handler import tf_op

    tf_loader.from_function = _freeze_once
    tf2onnx.optimizer.copy = _SharedConstantCopy()
    tf_op("Erfc")(_Erfc)  # tf2onnx's own registration; it has no Erfc handler of its own (1.17)


if __name__ == "__main__":
    from tf2onnx.convert import main

    install()
    main()

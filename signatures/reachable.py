"""Which captured variables a traced serving function really uses, read from its graph.

A signature loaded from a TF1 / Estimator SavedModel is a pruned `WrappedFunction` that captures every
variable of its MetaGraph (optimizer slots and `global_step` included), and a TF2 signature captures what its
`tf.Module` captured. Capture lists therefore over-state what serving needs. This walks the function graph
backwards from its outputs (and control outputs), descending into called library functions and following only
the arguments each callee itself uses, and reports the captured placeholders reached. Needs only protos
(`GraphDef`, `FunctionDef`); no TensorFlow import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tfship.core.graph_walk import called_functions, reachable_functions

CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")
__all__ = ["CALL_OPS", "called_functions", "reachable_functions", "used_arguments", "used_placeholders"]


def _node_name(tensor: str) -> str:
    return tensor.lstrip("^").split(":")[0]


def _callee(node, library: Mapping) -> str | None:
    if node.op in CALL_OPS:
        return node.attr["f"].func.name
    return node.op if node.op in library else None


def _walk(nodes: Mapping, roots: Iterable[str], terminals: set[str], library: Mapping, memo: dict) -> set[str]:
    """Names in `terminals` reached from `roots` (tensor strings) through `nodes`."""
    reached: set[str] = set()
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        name = _node_name(stack.pop())
        if name in terminals:
            reached.add(name)
            continue
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        node = nodes[name]
        callee = _callee(node, library)
        data = [i for i in node.input if not i.startswith("^")]
        if callee is not None and callee in library:
            used = used_arguments(library[callee], library, memo)
            stack.extend(data[index] for index in used if index < len(data))
        else:
            stack.extend(data)
        stack.extend(i for i in node.input if i.startswith("^"))
    return reached


def used_arguments(function_def, library: Mapping, memo: dict | None = None) -> set[int]:
    """Indices of `function_def`'s input args that reach one of its outputs or control outputs.

    Args:
        function_def: a `FunctionDef`.
        library: {function name: FunctionDef} for the functions it calls.
        memo: cache shared across calls (function name -> indices).
    """
    memo = {} if memo is None else memo
    name = function_def.signature.name
    if name in memo:
        return memo[name]
    memo[name] = set(range(len(function_def.signature.input_arg)))  # recursion guard: assume all used
    args = [a.name for a in function_def.signature.input_arg]
    nodes = {n.name: n for n in function_def.node_def}
    roots = [*function_def.ret.values(), *function_def.control_ret.values()]
    reached = _walk(nodes, roots, set(args), library, memo)
    memo[name] = {args.index(a) for a in reached}
    return memo[name]


def used_placeholders(graph_def, outputs: Iterable[str], placeholders: Iterable[str]) -> set[str]:
    """Names of `placeholders` (e.g. a concrete function's capture placeholders) that `outputs` depend on.

    Args:
        graph_def: the function graph as a `GraphDef` (with its function library).
        outputs: output tensor or op names of the function (`tensor.name` values).
        placeholders: placeholder op names to look for.
    """
    library = {f.signature.name: f for f in graph_def.library.function}
    nodes = {n.name: n for n in graph_def.node}
    return _walk(nodes, outputs, set(placeholders), library, {})

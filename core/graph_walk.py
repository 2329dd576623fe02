"""Walks over a MetaGraph's graph and function library, from protos alone (no TensorFlow).

What the export audit (`signatures.audit`) and the op policy (`core.op_policy`) share: which library functions a
node calls, which functions a set of nodes reaches, the top-level nodes a tensor depends on, and who reaches what
(each signature, the init ops, the saver, the object graph's functions).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

INIT_COLLECTIONS = ("saved_model_main_op", "legacy_init_op", "table_initializer")  # what TF1's loader runs
SAVER = "saver"
OBJECT_GRAPH = "object graph"


def node_name(tensor: str) -> str:
    """`name` of `^name`, `name:0` or (inside a function) `name:output:0`."""
    return tensor.lstrip("^").split(":")[0]


def called_functions(node, library: Mapping) -> Iterable[str]:
    """Library functions `node` calls: function-valued attributes (`f`, `then_branch`, `body`, ...) and a node
    whose op type is itself a library function (a TF1-style function call).
    """
    if node.op in library:
        yield node.op
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        for func in value.list.func:
            yield func.name


def reachable_functions(start_nodes: Iterable, library: Mapping, start_functions: Iterable[str] = ()) -> list[str]:
    """Names of the library functions reached from `start_nodes` (`NodeDef`s) and `start_functions`, in the
    order first reached, following every call (see `called_functions`) into the functions they call.
    """
    seen: dict[str, None] = {}
    stack = [*(name for node in start_nodes for name in called_functions(node, library)), *start_functions]
    while stack:
        name = stack.pop()
        if name in seen or name not in library:
            continue
        seen[name] = None
        stack.extend(called for node in library[name].node_def for called in called_functions(node, library))
    return list(seen)


def upstream(nodes: Mapping, roots: Iterable[str]) -> set[str]:
    """Names of the top-level nodes `roots` (tensor or node names) depend on, data and control inputs, roots
    included.
    """
    seen: set[str] = set()
    stack = [node_name(r) for r in roots]
    while stack:
        name = stack.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        stack.extend(node_name(i) for i in nodes[name].input)
    return seen


@dataclass(frozen=True)
class Reach:
    """Who reaches each top-level node and each library function of one MetaGraph.

    Attributes:
        nodes: top-level node name -> labels of what depends on it (signature keys, `__saved_model_init_op`,
            TF1 init collections, `saver`).
        functions: function name -> labels of what calls it (the same, and `object graph` for the functions the
            object graph names, which `tf.saved_model.load` restores and may call at load).
    """

    nodes: dict[str, tuple[str, ...]]
    functions: dict[str, tuple[str, ...]]


def meta_graph_reach(meta_graph) -> Reach:
    """The `Reach` of every signature (its outputs), init op, TF1 init collection, the saver and the object graph."""
    graph = meta_graph.graph_def
    nodes = {n.name: n for n in graph.node}
    library = {f.signature.name: f for f in graph.library.function}
    roots: dict[str, list[str]] = {key: [info.name for info in sd.outputs.values()]
                                   for key, sd in sorted(meta_graph.signature_def.items())}
    for key in INIT_COLLECTIONS:
        if key in meta_graph.collection_def:
            roots[key] = list(meta_graph.collection_def[key].node_list.value)
    saver = meta_graph.saver_def
    roots[SAVER] = [name for name in (saver.save_tensor_name, saver.restore_op_name) if name]
    by_node: dict[str, list[str]] = {}
    by_function: dict[str, list[str]] = {}
    for label, tensors in roots.items():
        closure = upstream(nodes, tensors)
        for name in closure:
            by_node.setdefault(name, []).append(label)
        for name in reachable_functions((nodes[n] for n in closure), library):
            by_function.setdefault(name, []).append(label)
    for name in reachable_functions((), library, list(meta_graph.object_graph_def.concrete_functions)):
        by_function.setdefault(name, []).append(OBJECT_GRAPH)
    return Reach({k: tuple(v) for k, v in by_node.items()}, {k: tuple(v) for k, v in by_function.items()})


def callers(library: Mapping, graph_nodes: Iterable) -> dict[str, list[tuple[str | None, object]]]:
    """Function name -> [(scope, calling node)]: scope None for the top-level graph, else the calling function."""
    found: dict[str, list[tuple[str | None, object]]] = {}
    scopes = [(None, list(graph_nodes))] + [(name, list(f.node_def)) for name, f in library.items()]
    for scope, scope_nodes in scopes:
        for node in scope_nodes:
            for name in set(called_functions(node, library)):
                found.setdefault(name, []).append((scope, node))
    return found

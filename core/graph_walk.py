"""Walks over a MetaGraph's graph and function library, from protos alone (no TensorFlow).

What the export audit (`signatures.audit`) and the op policy (`core.op_policy`) share: which library functions a
node calls, which functions a set of nodes reaches, the top-level nodes a tensor depends on, who reaches what
(each signature, the init ops, the saver, the object graph's functions), a MetaGraph's assets, and where a string
tensor comes from across function calls, variables and the object graph's bindings (`GraphTrace`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tfship.core import protocol

_CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")
_TRACE_STEPS = 10_000
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


class GraphTrace:
    """One MetaGraph's nodes, library, callers and assets, for tracing where a string tensor comes from."""

    def __init__(self, meta_graph) -> None:
        self.nodes = {n.name: n for n in meta_graph.graph_def.node}
        self.library = {f.signature.name: f for f in meta_graph.graph_def.library.function}
        self.assets = {node_name(tensor) for tensor, _ in assets_of(meta_graph)}
        self.saver_file = node_name(meta_graph.saver_def.filename_tensor_name)
        self.objects = meta_graph.object_graph_def.nodes  # what tf.saved_model.load binds to functions' captures
        self.bound = {name: list(f.bound_inputs) for name, f in meta_graph.object_graph_def.concrete_functions.items()}
        self._callers = None
        self._scopes: dict[str, Mapping] = {}

    def scope_nodes(self, scope: str | None) -> Mapping:
        if scope is None:
            return self.nodes
        if scope not in self._scopes:
            self._scopes[scope] = {n.name: n for n in self.library[scope].node_def}
        return self._scopes[scope]

    def depends_on(self, scope: str | None, tensor: str, target: str) -> bool:
        """Whether `tensor` of `scope` is computed from the top-level node `target` (through calls and arguments)."""
        stack, seen = [(scope, tensor)], set()
        while stack and len(seen) < _TRACE_STEPS:
            scope, tensor = stack.pop()
            key = (scope, node_name(tensor))
            if key in seen:
                continue
            if key == (None, target):
                return True
            seen.add(key)
            stack.extend(self._step(scope, key[1], []))
        return False

    def callers(self):
        if self._callers is None:
            self._callers = callers(self.library, self.nodes.values())
        return self._callers

    def sources(self, scope: str | None, tensor: str) -> list[str]:
        """Where the string `tensor` of `scope` (None: the graph) comes from, as the leaves that are not assets:
        [] means every leaf is an asset of the version (or a value the loader captures for a function).
        """
        bad: list[str] = []
        stack, seen, steps = [(scope, tensor)], set(), 0
        while stack and len(bad) < 3:
            scope, tensor = stack.pop()
            if (scope, node_name(tensor)) in seen:
                continue
            seen.add((scope, node_name(tensor)))
            steps += 1
            if steps > _TRACE_STEPS:
                return [*bad, "a graph too deep to trace"]
            stack.extend(self._step(scope, node_name(tensor), bad))
        return bad

    def _step(self, scope: str | None, name: str, bad: list[str]) -> list[tuple[str | None, str]]:
        if scope is not None:
            args = [a.name for a in self.library[scope].signature.input_arg]
            if name in args:
                return self._argument(scope, args, args.index(name), bad)
        nodes = self.scope_nodes(scope)
        node = nodes.get(name)
        if node is None:
            return []
        if scope is None and name in self.assets:
            return []
        data = [i for i in node.input if not i.startswith("^")]
        if node.op in ("Const", "Placeholder", "PlaceholderWithDefault") and not data:
            bad.append(f"{node.op} '{name[:100]}'" + (f" in function {scope[:100]}" if scope else ""))
            return []
        if node.op == "ReadVariableOp" and scope is None:
            handle = node_name(data[0])
            return [(None, n.input[1]) for n in nodes.values() if n.op == "AssignVariableOp" and n.input
                    and node_name(n.input[0]) == handle and len(n.input) > 1]
        called = [f for f in called_functions(node, self.library) if f in self.library]
        if called and node.op in (*_CALL_OPS, *self.library):
            return [(f, r) for f in called for r in self.library[f].ret.values()]
        if not data:
            bad.append(f"op {node.op} '{name[:100]}'")
        return [(scope, i) for i in data]


    def _argument(self, scope: str, args: list[str], index: int, bad: list[str]) -> list[tuple[str | None, str]]:
        """Where argument `index` of function `scope` comes from: its callers' inputs and, for a capture, what the
        object graph binds to it (an asset: fine; a constant: traced; a variable or anything else: a value the
        file chooses).
        """
        fed = [(s, _call_input(node, index, self.library)) for s, node in self.callers().get(scope, [])]
        found = [(s, tensor) for s, tensor in fed if tensor]
        bound = self.bound.get(scope)
        if bound is None:
            return found  # not in the object graph: only its callers (if any) can run it
        first = len(args) - len(bound)
        if index < first:
            if not fed:
                bad.append(f"argument '{args[index][:100]}' of function {scope[:100]}, given by whoever calls it")
            return found
        item = self.objects[bound[index - first]] if bound[index - first] < len(self.objects) else None
        kind = item.WhichOneof("kind") if item is not None else "missing node"
        if kind == "constant" and item is not None:
            return [*found, (None, item.constant.operation)]
        if kind != "asset":
            bad.append(f"a {kind} of the object graph bound to function {scope[:100]}")
        return found


def _call_input(node, index: int, library: Mapping) -> str | None:
    """The caller's data input that feeds argument `index` of the function `node` calls."""
    data = [i for i in node.input if not i.startswith("^")]
    offset = 1 if node.op in ("If", "StatelessIf") else 0
    if node.op in (*_CALL_OPS, "If", "StatelessIf", "While", "StatelessWhile") or node.op in library:
        return data[index + offset] if index + offset < len(data) else None
    return None


def assets_of(meta_graph) -> list[tuple[str, str]]:
    """(tensor name, file name under `assets/`) of each asset: `asset_file_def`, or for TF1 builders' exports the
    `saved_model_assets` collection of packed `AssetFileDef`s (what TensorFlow's loader reads when the field is
    empty).
    """
    found = [(a.tensor_info.name, a.filename) for a in meta_graph.asset_file_def]
    if not found and "saved_model_assets" in meta_graph.collection_def:
        kind = protocol.message_class("tensorflow.AssetFileDef")
        for item in meta_graph.collection_def["saved_model_assets"].any_list.value:
            asset = kind.FromString(item.value)
            found.append((asset.tensor_info.name, asset.filename))
    return found

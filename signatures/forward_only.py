"""Rewrite a freshly saved SavedModel's function library to what serving and loading reach, XLA-free.

`tf.saved_model.save` copies every function its traced functions' graphs carry. Two kinds of those break
serving or the audit although the serving signatures never need them:

* gradient functions: an op with a custom gradient (`tf.custom_gradient`; Keras' `swish` / `silu` on
  TensorFlow, `tf.nn.silu`) keeps its backward function `__inference_internal_grad_fn_*` in the library, and
  a loaded SavedModel re-saved with custom gradients on adds `__inference_gradient_func_*` callers. Nothing
  reachable from a signature, the checkpoint saver or the object graph calls them; they are removed.
* must-compile marks: a `tf.function(jit_compile=True)` inside a layer (Keras' grouped / channels-first
  convolutions on TensorFlow go through `_conv_xla`) is saved with `_XlaMustCompile=true`. A server without
  the XLA JIT (TensorFlow Serving's default build) cannot run such a function, and tf2onnx does not inline
  it (`No Op registered for StatefulPartitionedCall`). The mark is removed from the function and from the
  ops that call it: every op in it has an ordinary CPU kernel (grouped convolutions included), so it runs
  as a plain function with the same numbers. Such a function also carries `_noinline=true` (TensorFlow keeps
  an XLA cluster a call of its own), which the TFLite converter cannot lower (`StatefulPartitionedCallOp`
  left in the final IR); that attribute is removed from the unmarked functions too, so converters inline them.
  A grouped convolution in an unmarked function is rewritten into ops every CPU build runs
  (`signatures.grouped_conv`): unmarked as it was, Grappler fuses it with its bias into a kernel that refuses
  groups without oneDNN.

Only protos are read and written (no TensorFlow import).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tfship.core import protocol
from tfship.signatures.grouped_conv import rewrite_grouped_convolutions
from tfship.signatures.reachable import reachable_functions

MUST_COMPILE = "_XlaMustCompile"
NO_INLINE = "_noinline"


@dataclass(frozen=True)
class LibraryCleanup:
    """What `forward_only_library` changed.

    removed_functions: library functions nothing reaches (gradient functions and their callers);
    xla_unmarked: {function name: name scope of the op that called it (the Keras layer, e.g.
    `functional/grouped_conv`), or "" when only the function itself was marked};
    grouped_rewritten: `<function>/<node>` of each grouped convolution rewritten (`signatures.grouped_conv`).
    """

    removed_functions: tuple[str, ...] = ()
    xla_unmarked: dict[str, str] = field(default_factory=dict)
    grouped_rewritten: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"removed_functions": list(self.removed_functions), "xla_unmarked": dict(self.xla_unmarked),
                "grouped_rewritten": list(self.grouped_rewritten)}


def _scope(node_name: str) -> str:
    return node_name.rsplit("/", 1)[0] if "/" in node_name else ""


def object_graph_functions(meta_graph) -> list[str]:
    """Concrete functions the object graph names (what `tf.saved_model.load` restores as callables)."""
    graph = meta_graph.object_graph_def
    names = list(graph.concrete_functions)
    for node in graph.nodes:
        kind = node.WhichOneof("kind")
        if kind == "function":
            names.extend(node.function.concrete_functions)
        elif kind == "bare_concrete_function":
            names.append(node.bare_concrete_function.concrete_function_name)
    return names


def must_compile(attrs) -> bool:
    """True when an attr map (`NodeDef.attr`, `FunctionDef.attr`) holds `_XlaMustCompile=true`."""
    return MUST_COMPILE in attrs and attrs[MUST_COMPILE].b


def _unmark(nodes, where: dict[str, str]) -> None:
    for node in nodes:
        if MUST_COMPILE in node.attr:
            if must_compile(node.attr):
                for value in node.attr.values():
                    if value.HasField("func"):
                        where[value.func.name] = where.get(value.func.name) or _scope(node.name)
            del node.attr[MUST_COMPILE]


def _clean_meta_graph(meta_graph) -> LibraryCleanup:
    library = meta_graph.graph_def.library
    functions = {f.signature.name: f for f in library.function}
    keep = set(reachable_functions(meta_graph.graph_def.node, functions, object_graph_functions(meta_graph)))
    removed = tuple(sorted(set(functions) - keep))
    if removed:
        kept = [f for f in library.function if f.signature.name in keep]
        del library.function[:]
        library.function.extend(kept)
        registered = [g for g in library.registered_gradients if g.gradient_func in keep]
        del library.registered_gradients[:]
        library.registered_gradients.extend(registered)
    where: dict[str, str] = {}
    _unmark(meta_graph.graph_def.node, where)
    for function in library.function:
        _unmark(function.node_def, where)
        if MUST_COMPILE in function.attr:
            if must_compile(function.attr):
                where.setdefault(function.signature.name, "")
            del function.attr[MUST_COMPILE]
    grouped = []
    for function in library.function:
        if function.signature.name in where:
            if NO_INLINE in function.attr:
                del function.attr[NO_INLINE]
            grouped += [f"{function.signature.name}/{node}" for node in rewrite_grouped_convolutions(function)]
    return LibraryCleanup(removed, {name: where[name] for name in sorted(where)}, tuple(grouped))


def forward_only_library(saved_model_dir: Path) -> LibraryCleanup:
    """Remove unreachable functions and must-compile marks from every MetaGraph of `saved_model_dir`, in place.

    Raises:
        OSError: `saved_model.pb` cannot be read or written.
        ValueError: it is not a SavedModel.
    """
    path = Path(saved_model_dir) / "saved_model.pb"
    saved_model = protocol.SavedModel.FromString(path.read_bytes())
    removed: list[str] = []
    unmarked: dict[str, str] = {}
    grouped: list[str] = []
    for meta_graph in saved_model.meta_graphs:
        cleanup = _clean_meta_graph(meta_graph)
        removed += cleanup.removed_functions
        unmarked.update(cleanup.xla_unmarked)
        grouped += cleanup.grouped_rewritten
    if removed or unmarked:
        path.write_bytes(saved_model.SerializeToString(deterministic=True))
    return LibraryCleanup(tuple(dict.fromkeys(removed)), unmarked, tuple(dict.fromkeys(grouped)))

"""Read what a conversion needs from a SavedModel on disk, without loading (tracing) it.

Used inside the conversion worker (it imports TensorFlow). Reads `saved_model.pb` (through
`core.saved_model`) and the variables checkpoint directly: float tensors that overflow float16.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2
from tensorflow.core.protobuf import trackable_object_graph_pb2

from tfship.core.saved_model import read_saved_model, serving_meta_graph

FLOAT16_MAX = 65504.0
_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


@dataclass(frozen=True)
class Overflow:
    """A float tensor whose largest magnitude does not fit float16 (max finite 65504)."""

    kind: str  # "variable" or "constant"
    name: str
    max_abs: float

    def describe(self) -> str:
        """e.g. `variable 'dense_1/kernel' max |x| = 1e+06`."""
        return f"{self.kind} {self.name!r} max |x| = {self.max_abs:.6g}"


def _max_abs(value: np.ndarray) -> float:
    if value.size == 0 or value.dtype.kind != "f":
        return 0.0
    return float(np.max(np.abs(value.astype(np.float64))))


def _variable_names(reader) -> dict[str, str]:
    """Checkpoint key → the variable's own name (e.g. `sequential/dense/kernel`), where recorded."""
    names: dict[str, str] = {}
    if not reader.has_tensor(_OBJECT_GRAPH_KEY):
        return names
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
    for node in graph.nodes:
        for attribute in node.attributes:
            names[attribute.checkpoint_key] = attribute.full_name or attribute.checkpoint_key
    return names


def find_float16_overflows(saved_model_dir: Path, limit: float = FLOAT16_MAX) -> list[Overflow]:
    """Every float variable and `Const` whose magnitude exceeds `limit` (float16's largest finite value).

    Variables come from `variables/variables` (named by their variable name where the checkpoint records
    it); constants from the graph and every function in its library (named `function/node`).

    Returns:
        The overflowing tensors, largest first; empty when the model fits float16.
    """
    found: list[Overflow] = []
    prefix = saved_model_dir / "variables" / "variables"
    if prefix.with_suffix(".index").exists():
        reader = tf.train.load_checkpoint(str(prefix))
        names = _variable_names(reader)
        for key, _shape in tf.train.list_variables(str(prefix)):
            if key == _OBJECT_GRAPH_KEY:
                continue
            peak = _max_abs(np.asarray(reader.get_tensor(key)))
            if peak > limit:
                found.append(Overflow("variable", names.get(key) or key, peak))
    graph = serving_meta_graph(saved_model_dir).graph_def
    scopes = [("graph", graph.node)] + [(f.signature.name, f.node_def) for f in graph.library.function]
    for scope, nodes in scopes:
        for node in nodes:
            if node.op != "Const" or "value" not in node.attr:
                continue
            if not tf.dtypes.as_dtype(node.attr["value"].tensor.dtype).is_floating:
                continue
            tensor = tensor_pb2.TensorProto.FromString(node.attr["value"].tensor.SerializeToString())
            peak = _max_abs(tf.make_ndarray(tensor))
            if peak > limit:
                found.append(Overflow("constant", f"{scope}/{node.name}", peak))
    unique = {(o.kind, o.name): o for o in found}  # one variable can sit under several checkpoint keys
    return sorted(unique.values(), key=lambda o: -o.max_abs)


FILE_TABLE_INIT_OPS = ("InitializeTableFromTextFile", "InitializeTableFromTextFileV2")


def file_initialised_tables(saved_model_dir: Path) -> list[str]:
    """Asset file names that lookup tables are initialised from (`InitializeTableFromTextFileV2`).

    The TFLite converter keeps the `HASHTABLE` ops but has no builtin that reads a text file, so LiteRT
    finds such a table empty ("hashtable need to be initialized before using"). Returns the asset
    files of the SavedModel's `assets/` folder (sorted), or `["<unknown file>"]` when the op exists but
    names no asset; empty when no table is initialised from a file.
    """
    proto = read_saved_model(saved_model_dir)
    found = False
    for meta in proto.meta_graphs:
        nodes = list(meta.graph_def.node)
        for function in meta.graph_def.library.function:
            nodes.extend(function.node_def)
        found = found or any(node.op in FILE_TABLE_INIT_OPS for node in nodes)
    if not found:
        return []
    assets = sorted(p.name for p in (saved_model_dir / "assets").glob("*") if p.is_file())
    return assets or ["<unknown file>"]

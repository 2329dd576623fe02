"""Read what a conversion needs from a SavedModel on disk, without loading (tracing) it.

Used inside the conversion worker (it imports TensorFlow). Reads `saved_model.pb` and the variables
checkpoint directly: the signature's I/O contract, and float tensors that overflow float16.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2, trackable_object_graph_pb2

from core.errors import ContractError

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


def _load_proto(saved_model_dir: Path) -> saved_model_pb2.SavedModel:
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((saved_model_dir / "saved_model.pb").read_bytes())
    return proto


def read_signature(saved_model_dir: Path, signature_key: str = "serving_default") -> dict[str, Any]:
    """The signature's inputs and outputs as JSON-ready values.

    Returns:
        `{"inputs": {name: {"dtype": str, "shape": [int] | None}}, "outputs": {...}}`, with -1 for an
        unknown dimension and None for an unknown rank.

    Raises:
        ContractError: the SavedModel has no such signature.
    """
    meta = _load_proto(saved_model_dir).meta_graphs[0]
    if signature_key not in meta.signature_def:
        raise ContractError(
            f"SavedModel {str(saved_model_dir)!r} has no signature {signature_key!r}; "
            f"it has {sorted(meta.signature_def)}")
    signature = meta.signature_def[signature_key]

    def spec(info) -> dict[str, Any]:
        shape = None if info.tensor_shape.unknown_rank else [int(d.size) for d in info.tensor_shape.dim]
        return {"dtype": tf.dtypes.as_dtype(info.dtype).name, "shape": shape}

    return {
        "inputs": {name: spec(info) for name, info in sorted(signature.inputs.items())},
        "outputs": {name: spec(info) for name, info in sorted(signature.outputs.items())},
    }


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
                found.append(Overflow("variable", names.get(key, key), peak))
    graph = _load_proto(saved_model_dir).meta_graphs[0].graph_def
    scopes = [("graph", graph.node)] + [(f.signature.name, f.node_def) for f in graph.library.function]
    for scope, nodes in scopes:
        for node in nodes:
            if node.op != "Const" or "value" not in node.attr:
                continue
            if not tf.dtypes.as_dtype(node.attr["value"].tensor.dtype).is_floating:
                continue
            peak = _max_abs(tf.make_ndarray(node.attr["value"].tensor))
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
    proto = _load_proto(saved_model_dir)
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

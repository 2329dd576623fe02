"""The one reader of `saved_model.pb`, without TensorFlow, and `SignatureDef` <-> `Signature`.

Messages come from the committed descriptor set (`core.protocol`), wire-compatible with TensorFlow's
`saved_model_pb2`. A parsed file is kept per (path, modification time, size), so a pipeline run that
asks for the same SavedModel's signatures, graph and functions several times parses it once.
Callers must not modify the returned messages.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tfship.core import protocol
from tfship.core.contract import Signature, TensorSpec
from tfship.core.dtypes import data_type_of_dtype_name, dtype_name_of_data_type
from tfship.core.errors import ContractError

SERVE_TAGS = ("serve",)
_CACHE_SIZE = 8
MAX_PROTO_BYTES = 2**31 - 1  # protobuf's hard limit on one serialised message (TF Serving refuses above it)
_cache: dict[tuple[str, int, int], Any] = {}  # SavedModel messages: classes built at run time
_lock = threading.Lock()


def read_saved_model(saved_model_dir: Path):
    """The parsed `<saved_model_dir>/saved_model.pb` (a `tensorflow.SavedModel` message), cached.

    Raises:
        ContractError: the file is missing, not a SavedModel, or at least `MAX_PROTO_BYTES` long (refused
            before it is read; names the path and the cause).
    """
    path = Path(saved_model_dir) / "saved_model.pb"
    try:
        stat = path.stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
        with _lock:
            if key in _cache:
                return _cache[key]
        if stat.st_size >= MAX_PROTO_BYTES:  # refused before reading: a whole read of gigabytes for nothing
            raise ContractError(f"{path}: {stat.st_size} bytes, at or above protobuf's 2 GiB message limit "
                                f"({MAX_PROTO_BYTES} bytes): not a valid SavedModel (TF Serving cannot load it "
                                "either); keep large constants in variables/")
        proto = protocol.SavedModel.FromString(path.read_bytes())
    except (OSError, ValueError) as err:  # protobuf's DecodeError is a ValueError
        raise ContractError(f"{path}: cannot read SavedModel: {err}") from err
    with _lock:
        if len(_cache) >= _CACHE_SIZE:
            _cache.pop(next(iter(_cache)))
        _cache[key] = proto
    return proto


def select_meta_graph(saved_model, tags: tuple[str, ...] = SERVE_TAGS, where: str = "SavedModel"):
    """The MetaGraph whose tag-set is exactly `tags` (TensorFlow's and TF Serving's rule; default `serve`).

    A SavedModel with one MetaGraph that carries `serve` among its tags is accepted for the default too.
    TF1 / Estimator exports hold several (`serve`, `train`, `eval`); the `serve` one is what servers load.

    Raises:
        ContractError: no MetaGraph has that tag-set; the message lists the tag-sets present and `--tags`.
    """
    wanted = set(tags)
    for graph in saved_model.meta_graphs:
        if set(graph.meta_info_def.tags) == wanted:
            return graph
    graphs = saved_model.meta_graphs
    if tuple(tags) == SERVE_TAGS and len(graphs) == 1 and SERVE_TAGS[0] in graphs[0].meta_info_def.tags:
        return graphs[0]
    present = [sorted(g.meta_info_def.tags) for g in graphs]
    raise ContractError(f"{where}: no MetaGraph tagged {sorted(wanted)}; it has tag-sets {present}; "
                        "choose one with --tags (e.g. --tags serve,gpu)")


def serving_meta_graph(saved_model_dir: Path, tags: tuple[str, ...] = SERVE_TAGS):
    """The MetaGraphDef of `<saved_model_dir>/saved_model.pb` tagged `tags` (see `select_meta_graph`).

    Raises:
        ContractError: the file is unreadable or holds no such MetaGraph.
    """
    return select_meta_graph(read_saved_model(saved_model_dir), tags,
                             str(Path(saved_model_dir) / "saved_model.pb"))


def serving_tags(saved_model_dir: Path, tags: tuple[str, ...] = SERVE_TAGS) -> list[str]:
    """The tag-set of the MetaGraph served, to pass as `tf.saved_model.load(tags=...)`.

    A SavedModel with several MetaGraphs (TF1 / Estimator `serve` + `train` + `eval`) loads only with one.

    Raises:
        ContractError: see `serving_meta_graph`.
    """
    return sorted(serving_meta_graph(saved_model_dir, tags).meta_info_def.tags)


def read_signatures(saved_model_dir: Path, tags: tuple[str, ...] = SERVE_TAGS,
                    include_internal: bool = False) -> dict[str, Signature]:
    """Every `signature_def` of the MetaGraph tagged `tags` as `Signature`s, by signature name.

    Args:
        saved_model_dir: folder holding `saved_model.pb`.
        tags: the MetaGraph's tag-set (`select_meta_graph`).
        include_internal: also return TensorFlow's `__saved_model_init_op` entries (TF Serving's
            GetModelMetadata reports them; the pipeline does not).

    Raises:
        ContractError: see `serving_meta_graph`.
    """
    meta_graph = serving_meta_graph(saved_model_dir, tags)
    return {name: from_signature_def(name, sd) for name, sd in meta_graph.signature_def.items()
            if include_internal or not name.startswith("__")}


def _spec(alias: str, info) -> TensorSpec:
    shape = None if info.tensor_shape.unknown_rank else tuple(
        None if d.size < 0 else int(d.size) for d in info.tensor_shape.dim)
    return TensorSpec(dtype=dtype_name_of_data_type(info.dtype), shape=shape, tensor_name=info.name, name=alias)


def from_signature_def(name: str, signature_def) -> Signature:
    """The contract of one `tensorflow.SignatureDef` message (inputs and outputs by alias, sorted by alias: a
    protobuf map has no order, and the Python runtime's iteration order differs from process to process).
    """
    return Signature(name=name, inputs={k: _spec(k, v) for k, v in sorted(signature_def.inputs.items())},
                     outputs={k: _spec(k, v) for k, v in sorted(signature_def.outputs.items())},
                     method_name=signature_def.method_name)


def to_signature_def(signature: Signature):
    """`tensorflow.SignatureDef` message for a contract, as TF Serving reports it (-1 for unknown dims)."""
    proto = protocol.SignatureDef(method_name=signature.method_name)
    for target, specs in ((proto.inputs, signature.inputs), (proto.outputs, signature.outputs)):
        for key, spec in specs.items():
            info = target[key]
            info.name = spec.tensor_name or key
            try:
                info.dtype = data_type_of_dtype_name(spec.dtype)
            except ValueError:
                info.dtype = 0  # DT_INVALID: a backend type TensorFlow has no DataType for
            if spec.shape is None:
                info.tensor_shape.unknown_rank = True
            else:
                for dim in spec.shape:
                    info.tensor_shape.dim.add(size=-1 if dim is None else dim)
    return proto


def saved_model_weight_bytes(saved_model_dir: Path) -> int:
    """Bytes of the SavedModel's weights: `variables/` files plus `saved_model.pb` (which holds any constants).

    What the format converters' size limits (`convert.size_limit_bytes`) and peak-memory models are judged by.
    """
    root = Path(saved_model_dir)
    files = [root / "saved_model.pb", *(p for p in (root / "variables").glob("*") if p.is_file())]
    return sum(p.stat().st_size for p in files if p.is_file())

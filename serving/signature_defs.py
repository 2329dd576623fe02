"""`tensorflow.SignatureDef` <-> `Signature`, and reading a SavedModel's signatures without TensorFlow."""

from __future__ import annotations

from pathlib import Path

from core.errors import TfshipError
from serving import protocol
from serving.contract import Signature, TensorSpec
from serving.tensors import data_type, dtype_name, numpy_dtype


def _dtype(dt_enum: int) -> str:
    """Contract dtype name; DataTypes numpy cannot hold (DT_INVALID, DT_RESOURCE, ...) keep their enum name."""
    try:
        return dtype_name(numpy_dtype(dt_enum))
    except TfshipError:
        value = protocol.DATA_TYPE.values_by_number.get(dt_enum)
        return value.name if value else "DT_INVALID"


def _data_type(dtype: str) -> int:
    if dtype.startswith("DT_"):
        return protocol.DATA_TYPE.values_by_name[dtype].number
    return data_type("object" if dtype == "string" else dtype)


def _spec(info) -> TensorSpec:
    shape = None if info.tensor_shape.unknown_rank else tuple(
        None if d.size < 0 else int(d.size) for d in info.tensor_shape.dim)
    return TensorSpec(dtype=_dtype(info.dtype), shape=shape, tensor_name=info.name)


def from_signature_def(name: str, signature_def) -> Signature:
    """Contract of one `tensorflow.SignatureDef` (inputs/outputs by alias)."""
    return Signature(
        name=name,
        inputs={k: _spec(v) for k, v in signature_def.inputs.items()},
        outputs={k: _spec(v) for k, v in signature_def.outputs.items()},
        method_name=signature_def.method_name,
    )


def to_signature_def(signature: Signature):
    """`tensorflow.SignatureDef` for a contract, as TF Serving reports it (-1 for unknown dims)."""
    proto = protocol.SignatureDef(method_name=signature.method_name)
    for target, specs in ((proto.inputs, signature.inputs), (proto.outputs, signature.outputs)):
        for key, spec in specs.items():
            info = target[key]
            info.name = spec.tensor_name or key
            info.dtype = _data_type(spec.dtype)
            if spec.shape is None:
                info.tensor_shape.unknown_rank = True
            else:
                for dim in spec.shape:
                    info.tensor_shape.dim.add(size=-1 if dim is None else dim)
    return proto


def _serve_meta_graph(saved_model, path: Path):
    if not saved_model.meta_graphs:
        raise TfshipError(f"{path} holds no MetaGraphDef")
    for candidate in saved_model.meta_graphs:
        if "serve" in candidate.meta_info_def.tags:
            return candidate
    return saved_model.meta_graphs[0]


def serving_tags(version_dir: Path) -> list[str]:
    """The tag-set of the MetaGraph served (the first tagged `serve`, TF Serving's default
    `--saved_model_tags`), to pass as `tf.saved_model.load(tags=...)`: a SavedModel with several
    MetaGraphs (TF1 / Estimator `serve` + `train` + `eval`) loads only with one. TF-free."""
    path = Path(version_dir) / "saved_model.pb"
    try:
        saved_model = protocol.SavedModel.FromString(path.read_bytes())
    except (OSError, ValueError) as err:
        raise TfshipError(f"cannot read SavedModel tags from {path}: {err}") from err
    return sorted(_serve_meta_graph(saved_model, path).meta_info_def.tags)


def read_saved_model_signatures(version_dir: Path) -> dict[str, Signature]:
    """Signatures of `<version_dir>/saved_model.pb` (first MetaGraph, the `serve` one), TF-free.

    Follows TF Serving's GetModelMetadata: every SignatureDef is returned, `__saved_model_init_op`
    included. Raises `TfshipError` if the file is missing or unreadable.
    """
    path = Path(version_dir) / "saved_model.pb"
    try:
        saved_model = protocol.SavedModel.FromString(path.read_bytes())
    except (OSError, ValueError) as err:
        raise TfshipError(f"cannot read SavedModel signatures from {path}: {err}") from err
    meta_graph = _serve_meta_graph(saved_model, path)
    return {name: from_signature_def(name, sd) for name, sd in meta_graph.signature_def.items()}

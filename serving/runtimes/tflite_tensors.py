"""TFLite models without signature runners, served as TF Serving's TfLiteSession serves them.

A `model.tflite` converted without `signature_keys` (TF Serving's own half_plus_two test models, older
converters) has no signature runners. Its signatures come, as in TF Serving, from the file's
`signature_defs_metadata` (a flexbuffer map: signature name -> serialized `tensorflow.SignatureDef`, written by
TensorFlow Lite's signature_def_util), else one `serving_default` whose inputs and outputs are the model's
tensors by name. A call feeds each input tensor by index, resizing it to the request's shape when that differs
(TF Serving's ResizeInputTensor + AllocateTensors); the model judges the shape, and a shape it cannot take is
refused by LiteRT (INVALID_ARGUMENT, `input_rejected`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfship.core import protocol
from tfship.core.contract import PREDICT_METHOD, Signature, TensorSpec
from tfship.core.dtypes import dtype_name
from tfship.core.saved_model import from_signature_def

SIGNATURE_DEFS_METADATA = b"signature_defs_metadata"


@dataclass(frozen=True)
class TensorSignature:
    """One signature over the interpreter's tensors: its contract, and alias -> tensor index each way."""

    contract: Signature
    inputs: dict[str, int]
    outputs: dict[str, int]


def _legacy_name(name: str) -> str:
    """TF Serving's TfToTfLiteLegacyTensorName: `x:0` -> `x`."""
    return name[:-2] if name.endswith(":0") else name


def signature_defs_in_file(path: Path) -> dict:
    """`tensorflow.SignatureDef`s stored in the file's `signature_defs_metadata`, by name ({} when absent)."""
    from ai_edge_litert import schema_py_generated as schema
    from flatbuffers import flexbuffers

    data = Path(path).read_bytes()
    model = schema.Model.GetRootAsModel(data, 0)
    for i in range(model.MetadataLength()):
        metadata = model.Metadata(i)
        if metadata.Name() != SIGNATURE_DEFS_METADATA:
            continue
        buffer = model.Buffers(metadata.Buffer())
        raw = bytes(buffer.DataAsNumpy()) if buffer.DataLength() else data[buffer.Offset():buffer.Offset()
                                                                            + buffer.Size()]
        entries = flexbuffers.GetRoot(raw).AsMap
        return {key: protocol.SignatureDef.FromString(value.AsStringBytes)
                for key, value in zip(entries.Keys.Value, entries.Values)}
    return {}


def tensor_signatures(path: Path, interpreter) -> dict[str, TensorSignature]:
    """The file's signatures over `interpreter`'s input and output tensors (module docstring).

    Raises:
        ValueError: a stored SignatureDef names a tensor the model does not have.
    """
    inputs = {_legacy_name(d["name"]): d for d in interpreter.get_input_details()}
    outputs = {_legacy_name(d["name"]): d for d in interpreter.get_output_details()}
    stored = signature_defs_in_file(path)
    if not stored:
        contract = Signature("serving_default", inputs=_specs(inputs), outputs=_specs(outputs),
                             method_name=PREDICT_METHOD)
        return {"serving_default": TensorSignature(contract, {k: d["index"] for k, d in inputs.items()},
                                                   {k: d["index"] for k, d in outputs.items()})}
    out = {}
    for name, signature_def in stored.items():
        contract = from_signature_def(name, signature_def)
        out[name] = TensorSignature(contract, _indices(name, contract.inputs, inputs),
                                    _indices(name, contract.outputs, outputs))
    return out


def _specs(details: dict) -> dict[str, TensorSpec]:
    return {k: TensorSpec(dtype=dtype_name(d["dtype"]), shape=tuple(int(s) for s in d["shape"]), tensor_name=k)
            for k, d in details.items()}


def _indices(signature: str, specs: Mapping[str, TensorSpec], details: dict) -> dict[str, int]:
    out = {}
    for alias, spec in specs.items():
        found = details.get(_legacy_name(spec.tensor_name or alias))
        if found is None:
            raise ValueError(f"signature {signature!r}: {alias!r} references an unknown tensor {spec.tensor_name!r}; "
                             f"the model has {sorted(details)}")
        out[alias] = found["index"]
    return out


def run(interpreter, signature: TensorSignature, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feed `inputs` by tensor index (resized to their shapes where they differ), invoke, copy the outputs.

    Raises LiteRT's `ValueError` / `RuntimeError` for a shape or value the model cannot take.
    """
    resized = False
    for alias, index in signature.inputs.items():
        shape = inputs[alias].shape
        if tuple(interpreter.get_tensor(index).shape) != shape:
            interpreter.resize_tensor_input(index, list(shape))
            resized = True
    if resized:
        interpreter.allocate_tensors()
    for alias, index in signature.inputs.items():
        interpreter.set_tensor(index, np.ascontiguousarray(inputs[alias]))
    interpreter.invoke()
    return {alias: np.array(interpreter.get_tensor(index), copy=True) for alias, index in signature.outputs.items()}

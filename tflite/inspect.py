"""Describe a `.tflite` file without TensorFlow: signatures, I/O tensors, op histogram, Flex ops.

The op histogram is read from the flatbuffer itself (`ai_edge_litert.schema_py_generated`), so it lists the
ops the converter wrote, not the nodes left after LiteRT applies its default (XNNPACK) delegate.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter

from tfship.core.errors import ConversionError

FLEX_PREFIX = "Flex"
_BUILTIN_NAMES: dict[int, str] = {
    value: name for name, value in vars(schema.BuiltinOperator).items()
    if not name.startswith("_") and isinstance(value, int)
}


def op_histogram(model_bytes: bytes) -> dict[str, int]:
    """Count operators over every subgraph of a TFLite flatbuffer.

    Builtin ops are named as in the schema's `BuiltinOperator` (`CONV_2D`, `FULLY_CONNECTED`); custom ops
    by their custom code (Flex ops start with `Flex`, e.g. `FlexCumprod`).

    Args:
        model_bytes: the whole `.tflite` file.

    Returns:
        Op name → number of operator nodes, sorted by name.
    """
    model = schema.Model.GetRootAs(model_bytes, 0)
    names = []
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        # Schema >= 3 stores the code in BuiltinCode; older files only in DeprecatedBuiltinCode.
        builtin = max(int(code.BuiltinCode()), int(code.DeprecatedBuiltinCode()))
        if builtin == schema.BuiltinOperator.CUSTOM:
            custom = code.CustomCode()
            names.append(custom.decode() if isinstance(custom, bytes) else str(custom))
        else:
            names.append(_BUILTIN_NAMES.get(builtin, f"BUILTIN_{builtin}"))
    counts: Counter[str] = Counter()
    for s in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(s)
        for o in range(subgraph.OperatorsLength()):
            counts[names[subgraph.Operators(o).OpcodeIndex()]] += 1
    return dict(sorted(counts.items()))


def flex_ops(histogram: dict[str, int]) -> tuple[str, ...]:
    """Names of Flex (select TF) ops in an op histogram, sorted (e.g. `("FlexCumprod",)`)."""
    return tuple(sorted(name for name in histogram if name.startswith(FLEX_PREFIX)))


def _tensor_description(details: dict[str, Any]) -> dict[str, Any]:
    params = details.get("quantization_parameters", {})
    scales = np.asarray(params.get("scales", []), dtype=np.float64)
    return {
        "dtype": np.dtype(details["dtype"]).name,
        "shape_signature": [int(d) for d in details.get("shape_signature", details["shape"])],
        "quantization": None if scales.size == 0 else {
            "scales": [float(s) for s in scales],
            "zero_points": [int(z) for z in np.asarray(params.get("zero_points", []))],
            "quantized_dimension": int(params.get("quantized_dimension", 0)),
        },
    }


def describe_tflite(path: Path | str) -> dict[str, Any]:
    """Summarise a `.tflite` file as JSON-ready values.

    Args:
        path: the `.tflite` file.

    Returns:
        `{"path", "size_bytes", "subgraphs", "signatures": {key: {"inputs": {name: tensor},
        "outputs": {name: tensor}}}, "op_histogram": {op: count}, "flex_ops": [...], "custom_ops": [...]}`
        where each tensor is `{"dtype": numpy dtype name, "shape_signature": [int] (-1 = dynamic),
        "quantization": None | {"scales": [float], "zero_points": [int], "quantized_dimension": int}}`.
        `custom_ops` lists custom ops that are not Flex ops (they need a registered kernel).

    Raises:
        ConversionError: the file is missing or is not a TFLite model LiteRT can read.
    """
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"TFLite file {str(path)!r} does not exist")
    data = path.read_bytes()
    try:
        histogram = op_histogram(data)
        interpreter = Interpreter(model_content=data)
    except Exception as err:  # flatbuffers raises plain IndexError/struct.error on garbage
        raise ConversionError(f"{str(path)!r} is not a readable TFLite model: {err}") from err
    signatures = {}
    for key in sorted(interpreter.get_signature_list()):
        runner = interpreter.get_signature_runner(key)
        signatures[key] = {
            "inputs": {n: _tensor_description(d) for n, d in sorted(runner.get_input_details().items())},
            "outputs": {n: _tensor_description(d) for n, d in sorted(runner.get_output_details().items())},
        }
    builtin_names = set(_BUILTIN_NAMES.values())
    flex = flex_ops(histogram)
    return {
        "path": str(path),
        "size_bytes": len(data),
        "subgraphs": int(interpreter.num_subgraphs()),
        "signatures": signatures,
        "op_histogram": histogram,
        "flex_ops": list(flex),
        "custom_ops": sorted(n for n in histogram if n not in builtin_names and n not in flex),
    }


def signature_keys(model_bytes: bytes) -> tuple[str, ...]:
    """The signature keys a TFLite flatbuffer declares (its `SignatureDef`s), in file order."""
    model = schema.Model.GetRootAs(model_bytes, 0)
    keys = (model.SignatureDefs(i).SignatureKey() for i in range(model.SignatureDefsLength()))
    return tuple(k.decode("utf-8") if isinstance(k, bytes) else str(k) for k in keys)

"""A `.tflite` file judged before LiteRT builds an interpreter on it: a TFLite flatbuffer, with builtin ops only.

The file must carry the `TFL3` identifier and parse as a `tflite.Model` (LiteRT's own schema module, read in
Python: a truncated or corrupt file is refused with the reason, not handed to the C++ loader). Custom ops (the
`CUSTOM` builtin code, Flex's `Flex*` TensorFlow ops among them) are refused unless the operator allows them by
name (`--allow-ops`, `RuntimeOptions.allow_ops`): the bundled LiteRT registers none (it has no Flex delegate), and
a registered one is code outside the file's builtin kernels.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable
from pathlib import Path

IDENTIFIER = b"TFL3"


def tflite_problems(path: Path, allow_ops: Iterable[str] = ()) -> list[str]:
    """Why `path` is not a servable TFLite file: [] when it is one whose ops are builtins or allowed custom ops.

    Raises:
        OSError: the file cannot be read.
    """
    from ai_edge_litert import schema_py_generated as schema

    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < 8 or handle.read(8)[4:8] != IDENTIFIER:
            return [f"not a TFLite flatbuffer ({size} bytes, no {IDENTIFIER.decode()} identifier)"]
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:  # weights are not copied
            return _problems(schema, data, size, set(allow_ops))


def _problems(schema, data, size: int, allowed: set[str]) -> list[str]:
    try:
        model = schema.Model.GetRootAs(data, 0)
        custom = []
        for index in range(model.OperatorCodesLength()):
            code = model.OperatorCodes(index)
            if max(code.DeprecatedBuiltinCode(), code.BuiltinCode()) == schema.BuiltinOperator.CUSTOM:
                custom.append((code.CustomCode() or b"").decode(errors="replace"))
        for index in range(model.SubgraphsLength()):  # touch every operator: a cut file fails here, not in C++
            graph = model.Subgraphs(index)
            for op in range(graph.OperatorsLength()):
                if graph.Operators(op).OpcodeIndex() >= model.OperatorCodesLength():
                    return [f"operator {op} of subgraph {index} names operator code "
                            f"{graph.Operators(op).OpcodeIndex()}, past the file's {model.OperatorCodesLength()}"]
    except Exception as err:  # noqa: BLE001 - any parse failure of an untrusted file is the file's fault
        return [f"not a valid TFLite flatbuffer ({size} bytes): {type(err).__name__}: {err}"[:300]]
    refused = [name for name in dict.fromkeys(custom) if name not in allowed]
    return [f"custom op {name[:100]!r}" + (" (a TensorFlow op: LiteRT runs it only with the Flex delegate, which "
                                           "tfship's LiteRT lacks)" if name.startswith("Flex") else "")
            + " is refused (--allow-ops allows one by name)" for name in refused[:5]]

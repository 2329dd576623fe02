"""The TF.js conversion child: runs in `.venv-tfjs` (see `tfjs.venv`), never in the main process.

`python tfjs/worker.py --saved-model DIR --output DIR --quantization float32|float16|uint8 --report FILE`

1. Converts the SavedModel's `serving_default` with `tensorflowjs.converters.convert_tf_saved_model`
   (TF.js converter 4.22.0: freeze, Grappler, `model.json` + 4 MiB weight shards).
2. Names every output. The converter keys `model.json`'s `signature.outputs` by the signature's output
   name only when dtype and shape single it out; two outputs of one dtype and shape (`logits` and
   `probabilities`, float32 [-1, 10]) are left under their positional node names (`Identity_1:0`,
   `Identity_2:0`). The graph model's output nodes are the concrete function's outputs in `tf.nest`
   flattening order, so the worker rebuilds the map {signature output name: node} from the
   SavedModel itself, checks it against what the converter wrote (node present, dtype equal) and
   rewrites `signature.outputs` with every output under its own name.
3. Writes a JSON report: {"status": "produced"|"refused", "reason", "outputs": {name: node},
   "versions": {...}}; the words are `core.statuses.ConversionStatus`'s, written out because this script
   runs in `.venv-tfjs` and imports nothing of tfship. A Python exception that is not a refusal exits
   non-zero (the parent reports it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

QUANTIZATION_MAPS = {"float32": None, "float16": {"float16": "*"}, "uint8": {"uint8": "*"}}
_DTYPES = {"float32": "DT_FLOAT", "int32": "DT_INT32", "int64": "DT_INT64", "bool": "DT_BOOL",
           "string": "DT_STRING", "float16": "DT_HALF", "uint8": "DT_UINT8"}


def signature_output_nodes(saved_model_dir: Path, signature: str = "serving_default") -> dict[str, tuple[str, str]]:
    """{output name: (node tensor name such as `Identity_1:0`, TF dtype enum name)} of one signature.

    The order of a concrete function's `outputs` is `tf.nest.flatten(structured_outputs)` (dict keys
    sorted), which is also the order of the frozen graph's output nodes in the TF.js model.
    """
    import tensorflow as tf

    function = tf.saved_model.load(str(saved_model_dir)).signatures[signature]
    names = tf.nest.flatten({key: key for key in function.structured_outputs})
    return {name: (tensor.name, _DTYPES.get(tensor.dtype.name) or tensor.dtype.name)
            for name, tensor in zip(names, function.outputs, strict=True)}


def name_outputs(model_json: dict[str, Any], nodes: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """Rewrite `model_json["signature"]["outputs"]` so each output is keyed by its signature name.

    Raises:
        ValueError: a node of the SavedModel is missing from the converter's signature, or its dtype differs.
    """
    written = {entry["name"]: entry for entry in model_json["signature"]["outputs"].values()}
    outputs = {}
    for name, (node, dtype) in nodes.items():
        if node not in written:
            raise ValueError(f"output {name!r}: node {node!r} is not in model.json's signature "
                             f"(it has {sorted(written)})")
        if written[node].get("dtype") != dtype:
            raise ValueError(f"output {name!r}: model.json says {written[node].get('dtype')}, the SavedModel {dtype}")
        outputs[name] = {**written[node], "name": node}
    return {**model_json, "signature": {**model_json["signature"], "outputs": outputs}}


def convert(saved_model_dir: Path, output_dir: Path, quantization: str) -> dict[str, Any]:
    """Convert, name the outputs, and return the report (see the module docstring)."""
    import tensorflow as tf
    import tensorflowjs  # pyright: ignore[reportMissingImports]  # installed in .venv-tfjs only (tfjs/venv.py)
    from tensorflowjs.converters.tf_saved_model_conversion_v2 import (  # pyright: ignore[reportMissingImports]  # same
        convert_tf_saved_model,
    )

    nodes = signature_output_nodes(saved_model_dir)
    try:
        convert_tf_saved_model(str(saved_model_dir), str(output_dir), signature_def="serving_default",
                               saved_model_tags="serve", quantization_dtype_map=QUANTIZATION_MAPS[quantization])
    except (ValueError, NotImplementedError) as err:  # the converter's refusals: unsupported ops, bad signature
        return {"status": "refused", "reason": f"tensorflowjs converter: {type(err).__name__}: {err}"}
    model_path = output_dir / "model.json"
    try:
        named = name_outputs(json.loads(model_path.read_text()), nodes)
    except ValueError as err:
        return {"status": "refused", "reason": f"model.json outputs: {err}"}
    model_path.write_text(json.dumps(named))
    return {"status": "produced", "reason": "", "outputs": {name: node for name, (node, _) in nodes.items()},
            "versions": {"tensorflowjs": tensorflowjs.__version__, "tensorflow": tf.__version__}}


def main(argv: list[str] | None = None) -> int:
    """Run the TF.js conversion worker on the command line `argv`; returns the exit status."""
    parser = argparse.ArgumentParser(prog="tfjs/worker.py", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--saved-model", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--quantization", choices=sorted(QUANTIZATION_MAPS), default="float32")
    parser.add_argument("--report", type=Path, required=True)
    args = parser.parse_args(argv)
    report = convert(args.saved_model, args.output, args.quantization)
    tmp = args.report.with_name(f".{args.report.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report))
    os.replace(tmp, args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

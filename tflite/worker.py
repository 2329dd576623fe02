"""Child process for one TFLite conversion or one LiteRT check: `python -m tfship.tflite.worker {convert,smoke}`.

`tflite.convert.convert_tflite` runs each step in its own process so that a converter or runtime crash
(segfault, abort) fails only that variant. Each step writes a JSON report (`--report`, or stdout when
omitted) holding `status` ("produced" or "refused") and `reason`; a process that dies writes none, and the
parent reports it as crashed. `convert` imports TensorFlow; `smoke` imports only LiteRT and numpy.

Test hook (for tests of crash and timeout handling only): environment variable
`TFSHIP_TFLITE_WORKER_TEST_HOOK` set to `abort-convert` / `abort-smoke` makes that step call `os.abort()`
(SIGABRT) before doing anything; `kill-<step>` sends it SIGKILL, `raise-<step>` raises RuntimeError;
`hang-convert` / `hang-smoke` makes it sleep for an hour. `<hook>@<mode>` (e.g. `kill-convert@float16`)
applies to that mode's convert step only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfship.core.contract import Signature
from tfship.core.errors import TfshipError
from tfship.core.saved_model import read_signatures
from tfship.core.statuses import ConversionStatus
from tfship.tflite.inspect import flex_ops, op_histogram, signature_keys
from tfship.tflite.modes import TfliteMode, TfliteOptions

TEST_HOOK_ENV = "TFSHIP_TFLITE_WORKER_TEST_HOOK"
SIGNATURE_KEY = "serving_default"
SMOKE_BATCH = 3
_SELECT_OPS = re.compile(r"TF Select ops: ([\w, ]+)")
_CUSTOM_OPS = re.compile(r"Custom ops: ([\w, ]+)")


def _test_hook(step: str, mode: str = "") -> None:
    hook, _, only = os.environ.get(TEST_HOOK_ENV, "").partition("@")
    if only and only != mode:
        return
    if hook == f"abort-{step}":
        os.abort()
    if hook == f"kill-{step}":
        os.kill(os.getpid(), signal.SIGKILL)
    if hook == f"raise-{step}":
        raise RuntimeError(f"test hook {hook!r}")
    if hook == f"hang-{step}":
        time.sleep(3600)


def _ops_in(pattern: re.Pattern[str], message: str) -> list[str]:
    names: set[str] = set()
    for match in pattern.finditer(message):
        names.update(n.strip() for n in match.group(1).split(",") if n.strip())
    return sorted(names)


def _tail(message: str, limit: int = 600) -> str:
    message = " ".join(message.split())
    return message if len(message) <= limit else "..." + message[-limit:]


def _representative(path: str | None) -> dict[str, np.ndarray] | None:
    if not path:
        return None
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def _build_converter(tf, saved_model_dir: str, options: TfliteOptions,
                     samples: dict[str, np.ndarray] | None, flex: bool, keys: tuple[str, ...] = (SIGNATURE_KEY,)):
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir, signature_keys=list(keys))
    builtins = tf.lite.OpsSet.TFLITE_BUILTINS
    if options.mode is TfliteMode.FLOAT16:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif options.mode is TfliteMode.DYNAMIC_RANGE:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif options.mode is TfliteMode.INT8:
        builtins = tf.lite.OpsSet.TFLITE_BUILTINS_INT8
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        assert samples is not None  # int8 without representative inputs is refused first (_check_representative)
        count = min(options.representative_samples, len(next(iter(samples.values()))))

        def representative_dataset():
            for i in range(count):
                yield {name: np.asarray(rows[i:i + 1]) for name, rows in samples.items()}

        converter.representative_dataset = representative_dataset
        if options.int8_io == "int8":
            converter.inference_input_type = tf.int8
            converter.inference_output_type = tf.int8
    ops = [builtins, tf.lite.OpsSet.SELECT_TF_OPS] if flex else [builtins]
    converter.target_spec.supported_ops = ops
    if flex:  # a recurrent layer's TensorList ops stay Flex ops instead of failing to lower
        converter._experimental_lower_tensor_list_ops = False
    return converter


def _fixed_batch_attempt(tf, saved_model_dir: str, signature: Signature) -> str:
    """The `fixed_batch` recipe (`signatures.recurrent`): convert the signature traced at batch 1.

    A recurrent layer's TensorList ops lower to builtins once every shape is static. The file is not
    kept: a batch-1 model cannot serve batched requests. Returns the sentence for the refusal reason.
    """
    try:
        loaded = tf.saved_model.load(saved_model_dir)
        function = loaded.signatures[SIGNATURE_KEY]
        specs = {name: tf.TensorSpec(None if spec.shape is None else [1, *spec.shape[1:]],
                                     tf.as_dtype(spec.dtype), name=name)
                 for name, spec in signature.inputs.items()}
        fixed = tf.function(lambda feed: function(**feed), input_signature=[specs], autograph=False)
        converter = tf.lite.TFLiteConverter.from_concrete_functions([fixed.get_concrete_function()], loaded)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        converter.convert()
    except Exception as err:  # noqa: BLE001 - the converter raises ConverterError, ValueError, ...
        return f"recipe 'fixed_batch' (batch 1) fails too: {type(err).__name__}: {_tail(str(err), 300)}"
    return ("recipe 'fixed_batch' (batch 1) converts, but a batch-1 file cannot serve batched requests, so it "
            "is not kept")


def _check_representative(signature: Signature, samples: dict[str, np.ndarray] | None) -> str:
    """Empty when the samples fit the signature's inputs, else why not."""
    if samples is None:
        return "int8 needs representative inputs (none were given)"
    wanted, given = set(signature.inputs), set(samples)
    if wanted != given:
        return (f"representative inputs must be exactly the signature inputs {sorted(wanted)}; "
                f"got {sorted(given)}")
    rows = {name: len(value) for name, value in samples.items()}
    if len(set(rows.values())) != 1 or 0 in rows.values():
        return f"representative inputs need the same non-zero number of rows each; got {rows}"
    return ""


INT8_SIGNATURES_NOTE = ("int8 TFLite is calibrated on serving_default's inputs alone, so its file carries "
                        "serving_default only; the float32, float16 and dynamic-range files carry every signature")


def carried_signatures(signatures: dict[str, Signature], mode: TfliteMode) -> tuple[str, ...]:
    """The signatures one file carries: `serving_default` first, then the SavedModel's others (TFLite holds
    several), except int8, calibrated on `serving_default`'s inputs alone.
    """
    others = () if mode is TfliteMode.INT8 else tuple(sorted(k for k in signatures if k != SIGNATURE_KEY))
    return (SIGNATURE_KEY, *others)


def _convert_every_signature(tf, saved_model_dir: str, options: TfliteOptions, samples,
                             keys: tuple[str, ...]) -> tuple[bytes | None, dict[str, str]]:
    """(the file carrying every signature in `keys`, {}) or (None, {other signature: why not}); (None, {})
    when `keys` is `serving_default` alone. Builtin ops only: a file needing Flex takes the single path.
    """
    if len(keys) == 1:
        return None, {}
    try:
        return _build_converter(tf, saved_model_dir, options, samples, flex=False, keys=keys).convert(), {}
    except Exception as err:  # noqa: BLE001 - the caller converts serving_default alone
        return None, {k: f"the converter refused the signatures together: {type(err).__name__}: "
                         f"{_tail(str(err), 200)}" for k in keys[1:]}


def run_convert(saved_model_dir: str, output: str, options: TfliteOptions,
                representative: str | None) -> dict[str, Any]:
    """Convert one variant and write it to `output`; returns the report (see module docstring).

    The file carries `carried_signatures` (report `signatures`, their contracts in `other_signatures`); when
    the converter refuses the others, it is converted again with `serving_default` alone and
    `signatures_left_out` says why.
    """
    import tensorflow as tf

    from tfship.tflite.savedmodel_scan import file_initialised_tables

    try:
        signatures = read_signatures(Path(saved_model_dir))
    except TfshipError as err:
        return {"status": ConversionStatus.REFUSED, "reason": str(err)}
    if SIGNATURE_KEY not in signatures:
        return {"status": ConversionStatus.REFUSED,
                "reason": f"SavedModel {saved_model_dir!r} has no signature {SIGNATURE_KEY!r}; "
                          f"it has {sorted(signatures)}"}
    signature = signatures[SIGNATURE_KEY]
    keys = carried_signatures(signatures, options.mode)
    report: dict[str, Any] = {"signature": signature.to_json(), "flex_ops": [],
                              "table_files": file_initialised_tables(Path(saved_model_dir)),
                              "signatures": [SIGNATURE_KEY], "signatures_left_out": {}, "other_signatures": {}}
    samples = _representative(representative)
    if options.mode is TfliteMode.FLOAT16:
        from tfship.tflite.float16_check import float16_warnings

        report["warnings"] = float16_warnings(saved_model_dir, samples, lambda: _build_converter(
            tf, saved_model_dir, TfliteOptions(TfliteMode.FLOAT32), None, flex=False).convert())
    if options.mode is TfliteMode.INT8:
        problem = _check_representative(signature, samples)
        if problem:
            return {**report, "status": ConversionStatus.REFUSED, "reason": problem}
    uncarried = {k: INT8_SIGNATURES_NOTE for k in sorted(signatures) if k not in keys}
    model, refused = _convert_every_signature(tf, saved_model_dir, options, samples, keys)
    report["signatures_left_out"] = uncarried | refused
    if model is not None and SIGNATURE_KEY in signature_keys(model):
        return _write_every_signature_file(model, output, report, signatures, keys, uncarried)
    return _convert_serving_default_alone(tf, saved_model_dir, output, options, samples, signature, report)


def _write_every_signature_file(model: bytes, output: str, report: dict[str, Any], signatures: dict[str, Signature],
                                keys: tuple[str, ...], uncarried: dict[str, str]) -> dict[str, Any]:
    """Write the file carrying several signatures; the produced report names those the converter wrote."""
    Path(output).write_bytes(model)
    written = [k for k in keys if k in signature_keys(model)]
    return {**report, "status": ConversionStatus.PRODUCED, "reason": "", "signatures": written,
            "other_signatures": {k: signatures[k].to_json() for k in written if k != SIGNATURE_KEY},
            "signatures_left_out": uncarried | {
                k: "the TFLite converter did not write it (it keeps one of several signatures that run the same "
                   "function)" for k in keys if k not in written},
            "flex_ops": list(flex_ops(op_histogram(model)))}


def _convert_serving_default_alone(tf, saved_model_dir: str, output: str, options: TfliteOptions, samples,
                                   signature: Signature, report: dict[str, Any]) -> dict[str, Any]:
    """Convert `serving_default` alone (builtins, then Flex when allowed and needed) and write it to `output`."""
    try:
        model = _build_converter(tf, saved_model_dir, options, samples, flex=False).convert()
    except Exception as err:  # noqa: BLE001 - the converter raises ConverterError, ValueError or RuntimeError
        message = str(err)
        select, custom = _ops_in(_SELECT_OPS, message), _ops_in(_CUSTOM_OPS, message)
        if custom:
            return {**report, "status": ConversionStatus.REFUSED,
                    "reason": f"needs custom ops {custom} that neither TFLite builtins nor Flex provide"}
        tensor_list = "tensor list" in message.lower()
        if not select and not (tensor_list and options.allow_flex):
            reason = f"converter failed: {type(err).__name__}: {_tail(message)}"
            if tensor_list:
                reason += "; " + _fixed_batch_attempt(tf, saved_model_dir, signature)
            return {**report, "status": ConversionStatus.REFUSED, "reason": reason}
        if not options.allow_flex:
            return {**report, "status": ConversionStatus.REFUSED, "flex_ops": [f"Flex{op}" for op in select],
                    "reason": f"needs Flex (select TF) ops {select}, which the bundled LiteRT (ai_edge_litert) "
                              "cannot run: it has no Flex delegate. Express the layer with TFLite builtin ops; "
                              "set convert.allow_flex = true (--set convert.allow_flex=true) only to see whether "
                              "SELECT_TF_OPS converts it (such a file is still left out, since it cannot be checked)"}
        try:
            model = _build_converter(tf, saved_model_dir, options, samples, flex=True).convert()
        except Exception as flex_err:  # noqa: BLE001 - same converter, Flex allowed
            return {**report, "status": ConversionStatus.REFUSED, "flex_ops": [f"Flex{op}" for op in select],
                    "reason": f"converter failed with SELECT_TF_OPS (convert.allow_flex): "
                              f"{_tail(str(flex_err))}" + ("; the recurrent layer's tensor list ops could not be "
                                                           "lowered to builtins" if tensor_list else "")}
    Path(output).write_bytes(model)
    return {**report, "status": ConversionStatus.PRODUCED, "reason": "",
            "flex_ops": list(flex_ops(op_histogram(model)))}


def _smoke_inputs(contract, samples: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    if samples is not None:
        return {name: value[:SMOKE_BATCH] for name, value in samples.items()}
    rng = np.random.default_rng(0)
    feed = {}
    for spec in contract.inputs:
        shape = tuple(SMOKE_BATCH if d == -1 else d for d in spec.shape_signature)
        kind = "f" if spec.quantized else spec.dtype.kind
        feed[spec.name] = (rng.standard_normal(shape).astype(np.float32) if kind == "f"
                           else np.zeros(shape, dtype=spec.dtype))
    return feed


def _contract_problems(contract, signature: Signature) -> list[str]:
    problems = []
    for side, tensors in (("inputs", contract.inputs), ("outputs", contract.outputs)):
        names, specs = sorted(t.name for t in tensors), getattr(signature, side)
        if names != sorted(specs):
            problems.append(f"{side} are {names}; the SavedModel's are {sorted(specs)}")
            continue
        for tensor in tensors:
            declared = specs[tensor.name].shape
            if declared and declared[0] is None and tensor.shape_signature[:1] != (-1,):
                problems.append(f"{side[:-1]} {tensor.name!r} lost its dynamic batch dimension: "
                                f"shape_signature {list(tensor.shape_signature)}")
    return problems


def _litert_reason(err: Exception, table_files: list[str]) -> str:
    """LiteRT's own message, plus why when a lookup table initialised from a file was left empty."""
    reason = f"LiteRT could not run it: {_tail(str(err))}"
    if table_files and "HASHTABLE" in str(err):
        reason += (f"; the SavedModel initialises lookup table(s) from file(s) {table_files} "
                   "(InitializeTableFromTextFileV2), which the TFLite converter does not carry over, so LiteRT "
                   "finds the table empty. Build the lookup from an in-memory vocabulary (e.g. "
                   "StringLookup(vocabulary=[...]) with the list itself) to convert it to TFLite")
    return reason


def run_smoke_all(model: str, signature: Signature, representative: str | None, table_files: Sequence[str] = (),
                  others: dict[str, Signature] | None = None) -> dict[str, Any]:
    """`run_smoke` for `serving_default`, then for each other signature the file carries (`others`: name ->
    the SavedModel's contract; run on random inputs of its own shapes). The first refusal is the report's,
    its reason naming the signature.
    """
    report = run_smoke(model, signature, representative, table_files)
    for name, other in sorted((others or {}).items()):
        if report["status"] != ConversionStatus.PRODUCED:
            break
        own = run_smoke(model, other, None, table_files, signature_key=name)
        if own["status"] != ConversionStatus.PRODUCED:
            report = {**own, "reason": f"signature '{name}': {own['reason']}"}
    return report


def run_smoke(model: str, signature: Signature, representative: str | None,
              table_files: Sequence[str] = (), signature_key: str = SIGNATURE_KEY) -> dict[str, Any]:
    """Load `model` in LiteRT, check its `signature_key` contract against the SavedModel signature, run it once.

    `table_files`: asset files lookup tables are initialised from (named in the reason when LiteRT
    fails on an uninitialised `HASHTABLE`).
    """
    from tfship.serving.runtimes.litert import LiteRtModel

    histogram = op_histogram(Path(model).read_bytes())
    if "READ_VARIABLE" in histogram and "CALL_ONCE" not in histogram:
        return {"status": ConversionStatus.REFUSED, "reason": (
            "the model reads resource variables that nothing initializes (READ_VARIABLE without a CALL_ONCE "
            "initializer): the converter did not freeze the SavedModel's variables")}
    try:
        litert = LiteRtModel(model)
        contract = litert.contract(signature_key)
        problems = _contract_problems(contract, signature)
        if problems:
            return {"status": ConversionStatus.REFUSED, "reason": "contract differs: " + "; ".join(problems)}
        feed = _smoke_inputs(contract, _representative(representative))
        outputs = litert.run(feed, signature_key)
    except (TfshipError, ValueError, RuntimeError) as err:
        return {"status": ConversionStatus.REFUSED, "reason": _litert_reason(err, list(table_files))}
    sized = [len(value) for value in feed.values() if np.ndim(value) > 0]
    batch = sized[0] if sized else None  # None: every input is a scalar, no batch dimension to check
    for name, value in outputs.items():
        declared = signature.outputs[name].shape
        if batch is not None and declared and declared[0] is None and (value.ndim == 0 or value.shape[0] != batch):
            return {"status": ConversionStatus.REFUSED,
                    "reason": f"output {name!r} has shape {list(value.shape)} for a batch of {batch}"}
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            return {"status": ConversionStatus.REFUSED, "reason": f"output {name!r} is not finite on the sample"}
    return {"status": ConversionStatus.PRODUCED, "reason": "", "batch": batch}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tfship.tflite.worker", description=(__doc__ or "").splitlines()[0])
    steps = parser.add_subparsers(dest="step", required=True)
    convert = steps.add_parser("convert", help="convert a SavedModel's serving_default to .tflite")
    convert.add_argument("--saved-model", required=True)
    convert.add_argument("--output", required=True)
    convert.add_argument("--options", required=True, help="TfliteOptions as JSON")
    convert.add_argument("--representative", help=".npz with one array per signature input")
    convert.add_argument("--report", help="JSON report path (stdout when omitted)")
    smoke = steps.add_parser("smoke", help="load and run a .tflite once in LiteRT")
    smoke.add_argument("--model", required=True)
    smoke.add_argument("--signature", required=True, help="a convert report (holds the SavedModel signature)")
    smoke.add_argument("--representative")
    smoke.add_argument("--report")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one step; exit status 0 when a report was written (whatever its status)."""
    args = _parser().parse_args(argv)
    _test_hook(args.step, json.loads(args.options).get("mode", "") if args.step == "convert" else "")
    if args.step == "convert":
        options = TfliteOptions.from_mapping(json.loads(args.options))
        report = run_convert(args.saved_model, args.output, options, args.representative)
    else:
        converted = json.loads(Path(args.signature).read_text())
        others = {k: Signature.from_json(v) for k, v in converted.get("other_signatures", {}).items()}
        report = run_smoke_all(args.model, Signature.from_json(converted["signature"]), args.representative,
                               converted.get("table_files", []), others)
    text = json.dumps(report, indent=2, sort_keys=True)
    if args.report:
        Path(args.report).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

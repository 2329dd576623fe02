"""Left-out reasons a user can act on: the first line names the cause (never a temporary file name, a
traceback fragment or a page of converter notes), the full text is in the run folder, the Markdown report
stays a table whatever a reason holds, and `convert.allow_flex` says what the bundled LiteRT can do."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tfship.pipeline.conversion.convert import ConvertResult
from tfship.pipeline.orchestration.outcomes import artifact_outcomes
from tfship.pipeline.orchestration.reasons import FIRST_LINE_LIMIT, first_line, table_cell
from tfship.pipeline.orchestration.report import write_report
from tfship.pipeline.orchestration.stages import RunFolder

TF2ONNX_FAILURE = """onnx: tf2onnx exited 1:   File "/venv/lib/python3.11/site-packages/tf2onnx/tf_loader.py", line 617, in from_saved_model
    raise exceptions[0]
  File "/venv/lib/python3.11/site-packages/tf2onnx/tf_loader.py", line 601, in _from_saved_model_v2
    imported = tf.saved_model.load(model_path, tags)
ValueError: No Op registered for StatefulPartitionedCall in the graph of /tmp/runs/r1/candidate/.model.b2eee721.onnx
; reproduce: bash /tmp/runs/r1/artifacts/model.onnx.reproduce.sh"""

CONVERTER_NOISE = ("refused: converter failed: ConverterError: ...site-packages/tensorflow/lite/python/convert.py "
                   '<unknown>:0: error: loc(fused["Cumprod:", "functional_1/running_product/Cumprod@__inference_'
                   "serve_2611\"]): 'tf.Cumprod' op is neither a custom op nor a flex op <unknown>:0: note: "
                   + "loc(fused[...]): called from " * 60 + "<unknown>:0: error: failed while converting: 'main'")


def test_first_line_names_the_cause_not_the_traceback_or_temporary_file():
    line = first_line(TF2ONNX_FAILURE)
    assert line == ("onnx: tf2onnx exited 1: ValueError: No Op registered for StatefulPartitionedCall in the "
                    "graph of model.onnx")
    assert "raise exceptions" not in line and ".b2eee721" not in line and "reproduce" not in line


def test_first_line_names_the_op_and_the_layer_of_a_converter_failure():
    line = first_line(CONVERTER_NOISE)
    assert line.startswith("refused: converter failed: ConverterError: ops tf.Cumprod are neither")
    assert "at node 'functional_1/running_product/Cumprod'" in line and len(line) <= FIRST_LINE_LIMIT
    assert "called from" not in line


# A child's output tail as core.processes gives it: whitespace collapsed into one line.
CHILD_TAIL = ("onnx: tf2onnx exited with status 1; output tail: raph raise exceptions[0] File \"/v/tf2onnx/tfonnx.py\", "
              "line 292, in tensorflow_onnx_mapping func(g, node) File \"/v/tf2onnx/utils.py\", line 306, in make_sure "
              "raise ValueError(\"make_sure failure: \" + error_msg % args) ValueError: make_sure failure: Could not "
              "determine table shared name for node StatefulPartitionedCall/StatefulPartitionedCall/functional_1/"
              "text_vectorization_1/hash_table_Lookup/LookupTableFindV2; reproduce: /v/bin/python -m tf2onnx_lean")
KILLED_TAIL = ("tfjs: tensorflowjs_converter died with SIGKILL (signal 9); output tail: Traceback (most recent call "
               "last): File \"/v/converter.py\", line 9, in main convert() MemoryError: cannot allocate 4.1 GiB for "
               "the weights File \"/v/atexit.py\", line 1, in flush")


GRU_REFUSAL = ("refused: recipe 'default' (dynamic batch): converter failed: ConverterError: ... called from "
               "<unknown>:0: error: Lowering tensor list ops is failed. Please consider using Select TF ops and "
               "disabling `_experimental_lower_tensor_list_ops` flag; recipe 'unrolled' not available: no unrolled "
               "copy: ValueError: recurrent layer(s) ['gru'] have a dynamic time dimension; unrolling needs fixed steps")


def test_first_line_of_a_tensor_list_refusal_names_the_recurrent_layer_and_the_fix():
    line = first_line(GRU_REFUSAL)
    assert "recurrent layer(s) ['gru'] over a variable-length axis" in line and "fix that axis's length" in line
    assert len(line) <= FIRST_LINE_LIMIT and not line.endswith("…"), line
    loop = first_line(GRU_REFUSAL.split("; recipe 'unrolled'")[0])  # a tf.while_loop: no layer named
    assert "a loop (recurrent layer or tf.while_loop): its TensorList ops" in loop, loop
    assert "fix that axis" not in loop and "variable-length" not in loop, loop  # nothing says the axis varies


@pytest.mark.parametrize("reason, cause, prefix", [
    (CHILD_TAIL, "ValueError: make_sure failure: Could not determine table shared name for node functional_1/"
                 "text_vectorization_1/hash_table_Lookup/LookupTableFindV2", "onnx: tf2onnx exited with status 1"),
    (KILLED_TAIL, "MemoryError: cannot allocate 4.1 GiB for the weights", "tfjs: tensorflowjs_converter died with"),
])
def test_first_line_finds_the_exception_inside_a_child_s_one_line_output_tail(reason, cause, prefix):
    line = first_line(reason)
    assert line.startswith(prefix) and line.endswith(cause), line
    assert "File \"" not in line and "output tail" not in line and "reproduce" not in line


def test_first_line_keeps_a_short_reason_and_bounds_a_long_one():
    flex = "refused: needs Flex (select TF) ops ['Erf'], which the bundled LiteRT (ai_edge_litert) cannot run"
    assert first_line(flex) == flex
    long = first_line("crashed: LiteRT could not run it: " + "word " * 500)
    assert len(long) <= FIRST_LINE_LIMIT and long.endswith("…") and "\n" not in long
    assert table_cell("a | b\nc") == "a \\| b c" and table_cell("") == "-"


def _summary(run: RunFolder, reason: str) -> dict:
    conversions = [{"name": "onnx", "status": "refused", "reason": reason, "recipe": ""}]
    outcomes = artifact_outcomes(ConvertResult.from_json(conversions), None, None, (), run.root)
    return {"status_line": "status: partial", "run": str(run.root), "published": "x", "audit_passed": True,
            "artifacts": [o.to_json() for o in outcomes], "conversions": conversions, "parity": None,
            "stages": [{"name": "convert", "status": "ok", "seconds": 1.0, "reason": reason}]}


def test_full_reason_goes_to_the_run_folder_and_the_report_stays_a_table(tmp_path):
    run = RunFolder.create(tmp_path / "runs", "reasons")
    summary = _summary(run, TF2ONNX_FAILURE + "\n| a pipe | and more |")
    onnx = next(o for o in summary["artifacts"] if o["artifact"] == "onnx")
    assert onnx["reason"].startswith("refused: onnx: tf2onnx exited 1: ValueError: No Op registered")
    assert onnx["reason_file"] == "reasons/onnx.txt" and "full_reason" not in onnx
    assert (run.root / "reasons" / "onnx.txt").read_text().startswith("refused: " + TF2ONNX_FAILURE[:40])
    _, markdown = write_report(run, summary)
    columns = None
    for line in markdown.read_text().splitlines():  # every row keeps its table's columns: no raw newline or pipe
        if not line.startswith("|"):
            columns = None
            continue
        cells = len(re.split(r"(?<!\\)\|", line)) - 2
        columns = columns or cells
        assert cells == columns, line
    assert "full text: [reasons/onnx.txt](reasons/onnx.txt)" in markdown.read_text()


@pytest.mark.slow
def test_allow_flex_on_a_recurrent_layer_tries_flex_and_says_litert_cannot_run_it(tmp_path):
    """The recurrent path honours convert.allow_flex: the default recipe is retried with SELECT_TF_OPS, the
    reason says the bundled LiteRT cannot run Flex, and the unrolled recipe is still tried."""
    import keras

    from tfship.core.errors import TfshipError
    from tfship.pipeline.config import load_config
    from tfship.pipeline.export_only.user_model import load_user_data
    from tfship.pipeline.orchestration import steps

    keras.utils.set_random_seed(0)
    sequence = keras.Input((None, 4), name="sequence")
    model = keras.Model(sequence, keras.layers.Dense(3, name="scores")(keras.layers.LSTM(5, name="free")(sequence)))
    config = load_config(None, {"convert.tflite_modes": ["float32"], "export.behaviour_checks": False,
                                "convert.allow_flex": True})
    run = RunFolder.create(tmp_path / "runs", "flex")
    np.savez(tmp_path / "data.npz", sequence=np.random.default_rng(2).random((16, 6, 4), dtype=np.float32))
    steps.export_user_stage(config, run, model, tmp_path / "data.npz")
    data = load_user_data(tmp_path / "data.npz", steps.read_contract(run), 8, 0)
    try:
        reason = {o.name: o.reason for o in steps.convert_stage(config, run, data).outcomes}["tflite_float32"]
    except TfshipError as err:
        reason = str(err)
    assert "recipe 'default' (dynamic batch) with SELECT_TF_OPS (convert.allow_flex)" in reason, reason
    assert "no Flex delegate" in reason or "converter failed with SELECT_TF_OPS" in reason, reason
    assert "recipe 'unrolled' not available" in reason, reason

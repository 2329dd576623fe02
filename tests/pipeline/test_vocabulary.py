"""One source for the artifact vocabulary and the gate's numbers: the TFLite modes come from `tflite.modes`,
the tolerances from `pipeline.config`'s defaults, and docs/pipeline.md's tolerance table states exactly those."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfship.pipeline.config import TOP1_AGREEMENT_FLOORS, ConvertSection, ExportSection, ValidateSection
from tfship.pipeline.conversion.artifact_kinds import TFLITE_MODES as REGISTERED_MODES
from tfship.pipeline.conversion.artifacts import FLOAT_MODES, QUANTIZED_MODES, artifact_kinds
from tfship.tflite.modes import TFLITE_MODES, TfliteMode

DOC = Path(__file__).resolve().parents[2] / "docs" / "pipeline.md"


def _row(mode: str) -> str:
    rows = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith(f"| {mode} |")]
    assert len(rows) == 1, f"docs/pipeline.md has {len(rows)} tolerance rows for {mode}"
    return rows[0]


def test_one_list_of_tflite_modes():
    assert TFLITE_MODES == tuple(m.value for m in TfliteMode) and REGISTERED_MODES is TFLITE_MODES
    assert set(FLOAT_MODES) | set(QUANTIZED_MODES) == set(TFLITE_MODES)
    assert {f"tflite_{m}" for m in TFLITE_MODES} <= set(artifact_kinds())
    assert set(TOP1_AGREEMENT_FLOORS) == set(TFLITE_MODES)
    ConvertSection(tflite_modes=TFLITE_MODES)  # the config accepts exactly these
    with pytest.raises(ValueError):
        ConvertSection(tflite_modes=("int4",))


def test_the_docs_tolerance_table_states_the_config_defaults():
    v = ValidateSection()
    float32, float16, dynamic, int8 = (_row(m) for m in TFLITE_MODES)
    assert f"atol = {v.atol:g} (`validate.atol`)" in float32 and f"rtol = {v.rtol:g} (`validate.rtol`)" in float32
    assert f"atol = rtol = {v.float16_tolerance:g} (`validate.float16_tolerance`)" in float16
    assert f"≤ {v.dynamic_range_tolerance:g}·scale" in dynamic and f"≤ {v.int8_tolerance:g}·scale" in int8
    for row in (float32, float16):
        assert f"accuracy drop ≤ {v.max_accuracy_drop_points:g} points" in row
    for row in (dynamic, int8):
        assert f"accuracy drop ≤ {v.quantized_max_accuracy_drop_points:g} points" in row
    for mode, row in zip(TFLITE_MODES, (float32, float16, dynamic, int8), strict=True):
        assert row.rstrip().endswith(f"| {v.min_top1_agreement[mode]:g} % |"), row
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    assert f"at most {100 * v.quantized_outlier_fraction:g} % of an output's elements" in text
    assert f"(`validate.noise_multiplier`, default {v.noise_multiplier:g})" in text
    assert f"k = {v.implementation_noise_multiplier:g} (`validate.implementation_noise_multiplier`)" in float32
    assert f"(`validate.implementation_noise_multiplier`, default {v.implementation_noise_multiplier:g}" in text
    assert f"`validate.confidence` (default {v.confidence:g})" in text
    assert f"`validate.undecided` decides (default `{v.undecided}`" in text
    assert f"more than {100 * v.max_tie_share:g} % of the rows (`validate.max_tie_share`)" in text
    assert (f"`export.batch_independence_tolerance` (default {ExportSection().batch_independence_tolerance:g} "
            in text)
    sizes = ", ".join(str(size) for size in v.batch_sizes)
    assert f"between the batch sizes validate runs ({sizes})" in text

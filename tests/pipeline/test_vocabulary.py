"""One source for the artifact vocabulary and the gate's numbers: the TFLite modes come from `tflite.modes`,
the tolerances from the family tables' defaults (`pipeline.config_validate`), and docs/pipeline.md's tolerance
table states exactly those."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from tfship.core.formats import ToleranceFamily
from tfship.pipeline.config import TOP1_AGREEMENT_FLOORS, ConvertSection, ExportSection, ValidateSection
from tfship.pipeline.conversion.artifacts import artifact_kinds
from tfship.tflite.modes import TFLITE_MODES, TfliteMode, TfliteModeName

DOC = Path(__file__).resolve().parents[2] / "docs" / "pipeline.md"


def _row(mode: str) -> str:
    rows = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith(f"| {mode} |")]
    assert len(rows) == 1, f"docs/pipeline.md has {len(rows)} tolerance rows for {mode}"
    return rows[0]


def test_one_list_of_tflite_modes():
    assert TFLITE_MODES == tuple(m.value for m in TfliteMode) == get_args(TfliteModeName)
    assert set(TFLITE_MODES) == {family.value for family in ToleranceFamily}  # one TFLite mode per family
    assert {f"tflite_{m}" for m in TFLITE_MODES} <= set(artifact_kinds())
    assert set(TOP1_AGREEMENT_FLOORS) == {family.value for family in ToleranceFamily}
    ConvertSection(tflite_modes=TFLITE_MODES)  # the config accepts exactly these
    with pytest.raises(ValueError):
        ConvertSection(tflite_modes=("int4",))


def test_the_docs_tolerance_table_states_the_config_defaults():
    v = ValidateSection()
    float32, float16, dynamic, int8 = (_row(family) for family in ToleranceFamily)
    assert (f"atol = {v.float32.atol:g} (`validate.float32.atol`)" in float32
            and f"rtol = {v.float32.rtol:g} (`validate.float32.rtol`)" in float32)
    assert v.float16.atol == v.float16.rtol
    assert f"atol = rtol = {v.float16.atol:g} (`validate.float16.atol`, `validate.float16.rtol`)" in float16
    assert f"≤ {v.dynamic_range.atol:g}·scale" in dynamic and f"≤ {v.int8.atol:g}·scale" in int8
    assert v.dynamic_range.rtol == v.int8.rtol == 0.0  # the quantized rows state no relative part
    for family, row in zip(ToleranceFamily, (float32, float16, dynamic, int8), strict=True):
        table = v.family(family)
        assert f"accuracy drop ≤ {table.max_accuracy_drop_points:g} points" in row, row
        assert row.rstrip().endswith(f"| {table.min_top1_agreement:g} % |"), row
    assert v.float32.outlier_fraction == v.float16.outlier_fraction == 0.0
    assert v.dynamic_range.outlier_fraction == v.int8.outlier_fraction
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    assert f"at most {100 * v.int8.outlier_fraction:g} % of an output's elements" in text
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

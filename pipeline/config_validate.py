"""The `[validate]` section: the parity gate's settings, with one table of numbers per tolerance family.

Each tolerance family (`core.formats.ToleranceFamily`: float32, float16, dynamic_range, int8) has its own table,
`[validate.<family>]`, with the same five keys (`FamilyTolerance`); every artifact format names its family
(`core.formats.ArtifactFormat.family`), so a new format needs no key of its own. A table may give only the keys it
changes: the others keep that family's defaults (`FAMILY_DEFAULTS`, tabled in docs/pipeline.md and checked by
tests/pipeline/test_vocabulary.py). The settings shared by all families (noise multipliers, confidence, batch
sizes, the task metric) stay in `[validate]` itself.

The mode-named keys `[validate]` held in earlier versions (`int8_tolerance`, `atol`, ...: `MOVED_KEYS`) are refused
with one line naming the key that replaced them (`refuse_moved_keys`), never silently read or dropped.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from tfship.core.errors import ConfigError
from tfship.core.formats import ToleranceFamily
from tfship.pipeline.config_section import Section


class FamilyTolerance(Section):
    """One tolerance family's numbers (`[validate.float32]`, `[validate.int8]`, ...): the bound on every element of
    every float output is `atol * scale + rtol * |SavedModel value|` (scale = max(1, max |SavedModel output|)) plus
    the noise terms of `[validate]`; then the task metric and the decisions.
    """

    atol: float = Field(ge=0.0, description="Absolute part of the bound, as a fraction of max(1, max |SavedModel "
                        "output|) of each output.")
    rtol: float = Field(ge=0.0, description="Relative part of the bound, as a fraction of each SavedModel value.")
    outlier_fraction: float = Field(ge=0.0, lt=0.1, description="Share of an output's elements allowed beyond its "
                                    "bound (quantized families: held-out values a little outside the calibrated "
                                    "range), e.g. 0.001 = 0.1 %.")
    max_accuracy_drop_points: float = Field(ge=0.0, description="Allowed accuracy loss, percentage points.")
    min_top1_agreement: float = Field(ge=0.0, le=100.0, description="The least top-1 agreement (% of rows) of a "
                                      "float [N, C] output whose value bound is vacuous for it (at least half its "
                                      "median row spread, e.g. 10 % of the range against the probabilities of a "
                                      "1,000-class softmax).")


FAMILY_DEFAULTS: dict[ToleranceFamily, FamilyTolerance] = {
    ToleranceFamily.FLOAT32: FamilyTolerance(atol=1e-5, rtol=1e-5, outlier_fraction=0.0,
                                             max_accuracy_drop_points=0.5, min_top1_agreement=99.0),
    ToleranceFamily.FLOAT16: FamilyTolerance(atol=1e-2, rtol=1e-2, outlier_fraction=0.0,
                                             max_accuracy_drop_points=0.5, min_top1_agreement=99.0),
    ToleranceFamily.DYNAMIC_RANGE: FamilyTolerance(atol=2e-2, rtol=0.0, outlier_fraction=1e-3,
                                                   max_accuracy_drop_points=1.0, min_top1_agreement=95.0),
    ToleranceFamily.INT8: FamilyTolerance(atol=1e-1, rtol=0.0, outlier_fraction=1e-3,
                                          max_accuracy_drop_points=1.0, min_top1_agreement=90.0),
}
# Each family's default top-1 floor (% of rows), by family word.
TOP1_AGREEMENT_FLOORS = {family.value: table.min_top1_agreement for family, table in FAMILY_DEFAULTS.items()}
# Keys of `[validate]` that moved into the family tables: old key -> the key(s) that replaced it.
MOVED_KEYS = {
    "atol": "validate.float32.atol",
    "rtol": "validate.float32.rtol",
    "float16_tolerance": "validate.float16.atol and validate.float16.rtol",
    "dynamic_range_tolerance": "validate.dynamic_range.atol",
    "int8_tolerance": "validate.int8.atol",
    "quantized_outlier_fraction": "validate.dynamic_range.outlier_fraction and validate.int8.outlier_fraction",
    "max_accuracy_drop_points": "validate.float32.max_accuracy_drop_points and "
                                "validate.float16.max_accuracy_drop_points",
    "quantized_max_accuracy_drop_points": "validate.dynamic_range.max_accuracy_drop_points and "
                                          "validate.int8.max_accuracy_drop_points",
    "min_top1_agreement": "validate.<family>.min_top1_agreement (a table per tolerance family: float32, float16, "
                          "dynamic_range, int8)",
}


def refuse_moved_keys(tree: dict[str, Any], source: str) -> None:
    """Refuse a config whose `[validate]` table still uses a key that moved into the family tables.

    Raises:
        ConfigError: `<source>: key 'validate.<old>' moved: set <new key> instead`, for the first such key.
    """
    section = tree.get("validate")
    for old in MOVED_KEYS if isinstance(section, dict) else ():
        if isinstance(section, dict) and old in section:
            raise ConfigError(f"{source}: key 'validate.{old}' moved: set {MOVED_KEYS[old]} instead")


class ValidateSection(Section):
    """Parity gate between artifacts and the SavedModel."""

    float32: FamilyTolerance = Field(default=FAMILY_DEFAULTS[ToleranceFamily.FLOAT32], description=(
        "[validate.float32]: ONNX, TFLite float32, TF.js float32 (a second float32 implementation of the graph)."))
    float16: FamilyTolerance = Field(default=FAMILY_DEFAULTS[ToleranceFamily.FLOAT16], description=(
        "[validate.float16]: float16 weights (TFLite float16, TF.js float16)."))
    dynamic_range: FamilyTolerance = Field(default=FAMILY_DEFAULTS[ToleranceFamily.DYNAMIC_RANGE], description=(
        "[validate.dynamic_range]: integer weights, float activations (TFLite dynamic range, TF.js uint8)."))
    int8: FamilyTolerance = Field(default=FAMILY_DEFAULTS[ToleranceFamily.INT8], description=(
        "[validate.int8]: integer weights and activations (TFLite int8)."))
    noise_multiplier: float = Field(
        default=2.0, ge=1.0, description="Every float bound also allows this many times the largest difference the "
        "SavedModel shows against itself on that output (between the configured batch sizes and across repeated "
        "calls), so a difference the SavedModel shows against itself never fails anything.")
    implementation_noise_multiplier: float = Field(
        default=4.0, ge=0.0, description="Float32 artifacts (ONNX, TFLite float32) also allow this many times the "
        "SavedModel's own float32 rounding error on each float output (max |SavedModel - the same graph in "
        "float64| on the held-out rows): a second correct float32 implementation may round differently "
        "(docs/pipeline.md, Parity tolerances).")
    confidence: float = Field(
        default=0.95, gt=0.5, lt=1.0, description="Confidence of the decisions taken from counts of rows (accuracy "
        "drop, flipped decisions): exact binomial (Clopper-Pearson) bounds; a refusal and a pass are each wrong at "
        "most 1 - confidence of the time (docs/pipeline.md, Parity tolerances).")
    undecided: Literal["publish", "leave_out"] = Field(
        default="publish", description="What an artifact whose accuracy drop or flips too few held-out rows can decide "
        "(neither refused nor passed at validate.confidence) gets; every value bound still holds. The report "
        "gives the bounds and the rows that would decide.")
    binary_threshold: float | None = Field(
        default=None, description="Decision threshold of a one-column score output ([N, 1] or [N]): none = 0.5 when "
        "every SavedModel value lies in [0, 1] (a sigmoid probability), else 0 (a logit).")
    max_tie_share: float = Field(
        default=0.05, ge=0.0, le=1.0, description="Largest share of rows whose SavedModel top two scores lie within "
        "the artifact's error (ties): beyond it a vacuously bounded output, or a task metric excusing its flips as "
        "ties, is too flat to judge and fails.")
    batch_sizes: tuple[int, ...] = Field(default=(1, 7, 64), min_length=1, description="Batch sizes each artifact is "
                                         "run at.")
    task: Literal["auto", "classification", "regression"] = Field(
        default="auto", description="Task metric for quantized artifacts: auto picks from the labels' dtype "
        "(integer: classification accuracy; float: regression MAE).")
    prediction_output: str | None = Field(default=None, description="Output the task metric scores; none: picked "
                                          "from the contract (first index output, else first score output).")
    regression_max_error_increase: float = Field(
        default=0.02, ge=0.0, description="Allowed increase of MAE and of RMSE of quantized artifacts, as a fraction "
        "of the labels' standard deviation (regression tasks), decided with paired confidence bounds at "
        "validate.confidence (pipeline/gate/regression_judgement.py).")
    regression_row_quantile: float = Field(
        default=0.99, gt=0.5, le=1.0, description="Regression: the quantile over rows of |artifact - SavedModel| held "
        "to validate.regression_row_error_share (0.99: 99 rows of 100).")
    regression_row_error_share: float = Field(
        default=0.1, gt=0.0, description="Regression: that quantile may be at most this share of the SavedModel's own "
        "MAE against the labels (without labels: of the labels' standard deviation).")

    @field_validator("float32", "float16", "dynamic_range", "int8", mode="before")
    @classmethod
    def _over_family_defaults(cls, value: Any, info: ValidationInfo) -> Any:
        """A table gives only the keys it changes: the rest keep that family's defaults (not another family's)."""
        if isinstance(value, dict):
            return FAMILY_DEFAULTS[ToleranceFamily(info.field_name)].model_dump() | value
        return value

    def family(self, family: str) -> FamilyTolerance:
        """The table of tolerance family `family` (`core.formats.ToleranceFamily` or its word).

        Raises:
            ValueError: `family` is no tolerance family.
        """
        return getattr(self, ToleranceFamily(family).value)

    @field_validator("batch_sizes")
    @classmethod
    def _positive(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(size < 1 for size in value):
            raise ValueError("every batch size must be >= 1")
        return value


__all__ = ["FAMILY_DEFAULTS", "MOVED_KEYS", "TOP1_AGREEMENT_FLOORS", "FamilyTolerance", "ValidateSection",
           "refuse_moved_keys"]

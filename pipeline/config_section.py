"""The base of every config section: unknown keys refused, frozen, finite numbers only (`pipeline.config`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A TOML table of the pipeline config: extra keys are errors, values are immutable, NaN/Inf refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

"""The base of every config section: unknown keys refused, frozen, finite numbers only, and no silent type
conversion (`pipeline.config`).
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationInfo, field_validator

from tfship.core.locations import pydantic_validator

_NUMBERS = {int, float}

# A local path: a URL (s3://, gs://, ...) is refused naming the field, never taken for a folder name.
LocalPath = Annotated[Path, BeforeValidator(pydantic_validator("path", buckets=False))]


def _kinds(annotation: Any) -> set[Any]:
    """The leaf types of a field's annotation (unions and `Annotated` opened), literals as ("literal", value)."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return set().union(*(_kinds(arg) for arg in get_args(annotation)))
    if origin is Annotated:
        return _kinds(get_args(annotation)[0])
    if origin is Literal:
        return {("literal", value) for value in get_args(annotation)}
    return {annotation}


def _elements(annotation: Any) -> Any | None:
    """The element annotation of a list or tuple field (None when it is neither, or mixes element types)."""
    for kind in _kinds(annotation):
        origin = get_origin(kind)
        if origin in (list, tuple, set, frozenset):
            args = tuple(arg for arg in get_args(kind) if arg is not Ellipsis)
            return args[0] if args and all(arg == args[0] for arg in args) else None
    return None


def conversion_problem(annotation: Any, value: Any) -> str:
    """Why `value` would reach a field of type `annotation` only by a silent conversion ("" when it would not):
    a boolean or a string where only numbers are allowed (pydantic's lax mode reads `true` as 1 and "0.1" as
    0.1), or a number or a string where only true/false is (it reads 1 and "yes" as true). Lists and tuples are
    checked element by element.
    """
    if isinstance(value, (list, tuple)):
        element = _elements(annotation)
        return next((f"item {i}: {p}" for i, item in enumerate(value)
                     if element is not None and (p := conversion_problem(element, item))), "")
    kinds = _kinds(annotation) - {type(None)}
    literals = {kind[1] for kind in kinds if isinstance(kind, tuple)}
    plain = {kind for kind in kinds if not isinstance(kind, tuple)}
    if any(type(value) is type(v) and value == v for v in literals):
        return ""
    if isinstance(value, bool) and bool not in plain and plain & _NUMBERS:
        return "expected a number, got a boolean"
    if isinstance(value, str) and plain and plain <= _NUMBERS | {bool}:
        return "expected " + ("true or false" if plain == {bool} else "a number") + ", got a string"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and plain == {bool}:
        return "expected true or false, got a number"
    return ""


class Section(BaseModel):
    """A TOML table of the pipeline config: extra keys are errors, values are immutable, NaN/Inf refused, and a
    value of the wrong TOML type is refused rather than converted (`conversion_problem`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_silent_conversion(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None  # a field validator ("*"): pydantic names the field
        problem = conversion_problem(cls.model_fields[info.field_name].annotation, value)
        if problem:
            raise ValueError(problem)
        return value

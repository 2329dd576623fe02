"""The one signature contract: named, typed tensors a signature takes and returns.

Mirrors TF Serving's `SignatureDef`: `inputs` and `outputs` map aliases to `TensorSpec`s in
declaration order (for a SavedModel read back, the order `saved_model.pb` stores them). Export,
audit, conversion, the parity gate, the runtimes and `GetModelMetadata` all use this type.

Dtypes are contract names (`core.dtypes`: `float32`, `int64`, `string`, `bfloat16`, ...). Shapes are
tuples with `None` for an unknown dimension (TF Serving's -1; index 0 is conventionally the batch);
a shape of `None` means unknown rank and `()` a scalar.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tfship.core.errors import ContractError

DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"

Shape = tuple[int | None, ...] | None


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a signature.

    Attributes:
        dtype: contract dtype name (`float32`, `int64`, `string`, ...).
        shape: dimensions, `None` for unknown; `None` instead of a tuple means unknown rank.
        tensor_name: graph tensor name TF Serving reports (e.g. `serving_default_image:0`); empty when unknown.
        name: the alias (the key in `Signature.inputs` / `outputs`); filled in by `Signature`.
    """

    dtype: str
    shape: Shape
    tensor_name: str = ""
    name: str = ""

    def describe(self) -> str:
        """Human form, e.g. `float32[?,8,8,1]`, `float32[]` (scalar) or `float32[<any rank>]`."""
        if self.shape is None:
            return f"{self.dtype}[<any rank>]"
        return f"{self.dtype}[{','.join('?' if d is None else str(d) for d in self.shape)}]"

    @property
    def rank(self) -> int | None:
        """Number of dimensions, None for unknown rank."""
        return None if self.shape is None else len(self.shape)

    def to_json(self) -> dict[str, Any]:
        """`{"name", "dtype", "shape"}`: -1 for an unknown dimension, `null` for unknown rank (TF Serving's -1)."""
        shape = None if self.shape is None else [-1 if d is None else d for d in self.shape]
        return {"name": self.name, "dtype": self.dtype, "shape": shape}

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> TensorSpec:
        """Inverse of `to_json`."""
        raw = payload["shape"]
        shape = None if raw is None else tuple(None if int(d) < 0 else int(d) for d in raw)
        return cls(dtype=str(payload["dtype"]), shape=shape, name=str(payload.get("name", "")))


@dataclass(frozen=True)
class Signature:
    """A named signature: `inputs` and `outputs` map aliases to `TensorSpec`s (declaration order kept).

    Each spec's `name` is set to its alias; a spec carrying a different name is refused.

    Raises:
        ContractError: a spec's `name` differs from its alias.
    """

    name: str
    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    method_name: str = field(default=PREDICT_METHOD)

    def __post_init__(self) -> None:
        for side in ("inputs", "outputs"):
            named = {}
            for alias, spec in getattr(self, side).items():
                if spec.name and spec.name != alias:
                    raise ContractError(f"signature {self.name!r}: {side} alias {alias!r} holds a spec named "
                                        f"{spec.name!r}")
                named[alias] = spec if spec.name == alias else replace(spec, name=alias)
            object.__setattr__(self, side, named)

    @classmethod
    def of(cls, name: str, inputs: Iterable[TensorSpec], outputs: Iterable[TensorSpec],
           method_name: str = PREDICT_METHOD) -> Signature:
        """A signature from named specs, in the order given."""
        return cls(name, {t.name: t for t in inputs}, {t.name: t for t in outputs}, method_name)

    def input_names(self) -> tuple[str, ...]:
        """Input aliases in declaration order."""
        return tuple(self.inputs)

    def output_names(self) -> tuple[str, ...]:
        """Output aliases in declaration order."""
        return tuple(self.outputs)

    def to_json(self) -> dict[str, Any]:
        """JSON form used in `manifest.json`, reports and the conversion worker's files."""
        payload = {"name": self.name, "inputs": [t.to_json() for t in self.inputs.values()],
                   "outputs": [t.to_json() for t in self.outputs.values()]}
        if self.method_name != PREDICT_METHOD:
            payload["method_name"] = self.method_name
        return payload

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> Signature:
        """Inverse of `to_json`."""
        return cls.of(str(payload["name"]), (TensorSpec.from_json(t) for t in payload["inputs"]),
                      (TensorSpec.from_json(t) for t in payload["outputs"]),
                      str(payload.get("method_name", PREDICT_METHOD)))


def _shape_problem(kind: str, name: str, want: Shape, got: Shape) -> str | None:
    if want is None or got is None:
        if want is None and got is None:
            return None
        return f"{kind} '{name}' rank {'unknown' if got is None else len(got)}, expected " \
               f"{'unknown rank' if want is None else list(want)}"
    if len(want) != len(got):
        return f"{kind} '{name}' rank {len(got)} {list(got)}, expected {list(want)}"
    if any(x is not None and y is not None and x != y for x, y in zip(want[1:], got[1:])):
        return f"{kind} '{name}' shape {list(got)}, expected {list(want)}"
    return None


def compare_contracts(expected: Signature, written: Signature, where: str) -> None:
    """Fail unless `written` has exactly the expected names, dtypes and ranks (and fixed dims past the batch).

    Raises:
        ContractError: listing every difference, naming `where` (file or artifact) they were read from.
    """
    problems: list[str] = []
    for kind, want, got in (("input", expected.inputs, written.inputs), ("output", expected.outputs, written.outputs)):
        for name in sorted(set(want) - set(got)):
            problems.append(f"{kind} '{name}' missing (has {sorted(got)})")
        for name in sorted(set(got) - set(want)):
            problems.append(f"unexpected {kind} '{name}'")
        for name in sorted(set(want) & set(got)):
            a, b = want[name], got[name]
            if a.dtype != b.dtype:
                problems.append(f"{kind} '{name}' dtype {b.dtype}, expected {a.dtype}")
            problem = _shape_problem(kind, name, a.shape, b.shape)
            if problem:
                problems.append(problem)
    if problems:
        raise ContractError(f"{where}: signature '{expected.name}' differs from the contract: " + "; ".join(problems))

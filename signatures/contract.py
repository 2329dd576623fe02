"""The serving contract: named, typed tensors a signature takes and returns.

Dtypes are numpy dtype names (`float32`, `int64`, `string` for tf.string); shapes use `None` for
unknown dimensions and always `None` for the batch dimension (TF Serving's -1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.errors import ContractError

DEFAULT_SIGNATURE = "serving_default"


@dataclass(frozen=True)
class TensorContract:
    """One named tensor: dtype name and shape (None = any size; index 0 is the batch dimension)."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]

    def to_json(self) -> dict[str, Any]:
        """{"name", "dtype", "shape"} with -1 for unknown dimensions (TF Serving's convention)."""
        return {"name": self.name, "dtype": self.dtype, "shape": [-1 if d is None else d for d in self.shape]}

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> "TensorContract":
        """Inverse of `to_json`."""
        shape = tuple(None if int(d) < 0 else int(d) for d in payload["shape"])
        return cls(str(payload["name"]), str(payload["dtype"]), shape)


@dataclass(frozen=True)
class SignatureContract:
    """A signature's name and its input and output tensors, in declaration order."""

    name: str
    inputs: tuple[TensorContract, ...]
    outputs: tuple[TensorContract, ...]

    def to_json(self) -> dict[str, Any]:
        """JSON form used in `manifest.json` and reports."""
        return {"name": self.name, "inputs": [t.to_json() for t in self.inputs],
                "outputs": [t.to_json() for t in self.outputs]}

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> "SignatureContract":
        """Inverse of `to_json`."""
        return cls(payload["name"], tuple(TensorContract.from_json(t) for t in payload["inputs"]),
                   tuple(TensorContract.from_json(t) for t in payload["outputs"]))

    def output_names(self) -> tuple[str, ...]:
        """Output names in declaration order."""
        return tuple(t.name for t in self.outputs)


def classifier_contract(input_name: str, input_shape: tuple[int, ...], num_classes: int,
                        input_dtype: str = "float32") -> SignatureContract:
    """The built-in classifier contract.

    Input `<input_name>` `input_dtype` (float32 unless the model declares e.g. int32 token ids)
    [-1, *input_shape]; outputs `logits` float32 [-1, num_classes], `probabilities` float32
    [-1, num_classes], `class_id` int64 [-1].
    """
    return SignatureContract(
        name=DEFAULT_SIGNATURE,
        inputs=(TensorContract(input_name, input_dtype, (None, *input_shape)),),
        outputs=(
            TensorContract("logits", "float32", (None, num_classes)),
            TensorContract("probabilities", "float32", (None, num_classes)),
            TensorContract("class_id", "int64", (None,)),
        ),
    )


def compare_contracts(expected: SignatureContract, written: SignatureContract, where: str) -> None:
    """Fail unless `written` has exactly the expected names, dtypes and ranks (and fixed dims).

    Raises:
        ContractError: listing every difference, naming `where` (file or artifact) they were read from.
    """
    problems: list[str] = []
    for kind, want, got in (("input", expected.inputs, written.inputs), ("output", expected.outputs, written.outputs)):
        want_map, got_map = {t.name: t for t in want}, {t.name: t for t in got}
        for name in sorted(set(want_map) - set(got_map)):
            problems.append(f"{kind} '{name}' missing (has {sorted(got_map)})")
        for name in sorted(set(got_map) - set(want_map)):
            problems.append(f"unexpected {kind} '{name}'")
        for name in sorted(set(want_map) & set(got_map)):
            a, b = want_map[name], got_map[name]
            if a.dtype != b.dtype:
                problems.append(f"{kind} '{name}' dtype {b.dtype}, expected {a.dtype}")
            if len(a.shape) != len(b.shape):
                problems.append(f"{kind} '{name}' rank {len(b.shape)} {list(b.shape)}, expected {list(a.shape)}")
            elif any(x is not None and y is not None and x != y for x, y in zip(a.shape[1:], b.shape[1:])):
                problems.append(f"{kind} '{name}' shape {list(b.shape)}, expected {list(a.shape)}")
    if problems:
        raise ContractError(f"{where}: signature '{expected.name}' differs from the contract: " + "; ".join(problems))

"""TFLite conversion modes and the options that tune them.

Options are a frozen dataclass, validated on construction; `TfliteOptions.from_mapping` is the one way in
from config or JSON and refuses unknown keys (`ConversionError`). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from tfship.core.errors import ConversionError


class TfliteMode(str, Enum):
    """How the TFLite converter is asked to represent the model (TFLite post-training quantization recipes).

    - `float32`: no optimization; weights and activations stay float32.
    - `float16`: float16 weights (`optimizations=[DEFAULT]`, `target_spec.supported_types=[tf.float16]`);
      kernels dequantize to float32 at run time on CPU.
    - `dynamic_range`: int8 weights, float activations (`optimizations=[DEFAULT]`, no representative data).
    - `int8`: full integer quantization (`TFLITE_BUILTINS_INT8` with a representative dataset); I/O stays
      float unless `TfliteOptions.int8_io == "int8"`.
    """

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    DYNAMIC_RANGE = "dynamic_range"
    INT8 = "int8"


# The one list of TFLite modes (and of the parity gate's modes: ONNX and TF.js map onto them), in order.
TFLITE_MODES: tuple[str, ...] = tuple(mode.value for mode in TfliteMode)
# The same names as a type (the config's `convert.tflite_modes`); tests/pipeline/test_vocabulary.py holds them equal.
TfliteModeName = Literal["float32", "float16", "dynamic_range", "int8"]

Int8Io = Literal["float", "int8"]
_INT8_IO_VALUES: tuple[str, ...] = ("float", "int8")


@dataclass(frozen=True)
class TfliteOptions:
    """One TFLite variant to produce.

    Attributes:
        mode: the conversion recipe (`TfliteMode`).
        representative_samples: calibration samples for `int8` (rows taken from the representative inputs,
            one row per `representative_dataset` step); ignored by the other modes. At least 1.
        int8_io: `"float"` keeps float32 inputs/outputs around an int8 graph; `"int8"` sets the converter's
            `inference_input_type`/`inference_output_type` to `tf.int8`. Only valid with `mode == int8`.
            Integer outputs (for example an int64 `argmax`) keep their integer dtype in both cases.
        allow_flex: when the builtin op set cannot express the graph, retry with `SELECT_TF_OPS` (Flex).
            The artifact is still only `produced` if LiteRT runs it.

    Raises:
        ConversionError: a field has the wrong type or an out-of-range value.
    """

    mode: TfliteMode
    representative_samples: int = 200
    int8_io: Int8Io = "float"
    allow_flex: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", TfliteMode(self.mode))
        except ValueError as err:
            allowed = ", ".join(m.value for m in TfliteMode)
            raise ConversionError(f"unknown TFLite mode {self.mode!r}; expected one of: {allowed}") from err
        samples = self.representative_samples
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ConversionError(f"representative_samples must be an integer >= 1, got {samples!r}")
        if self.int8_io not in _INT8_IO_VALUES:
            raise ConversionError(f"int8_io must be one of {_INT8_IO_VALUES}, got {self.int8_io!r}")
        if self.int8_io == "int8" and self.mode is not TfliteMode.INT8:
            raise ConversionError(f"int8_io='int8' needs mode 'int8', got mode {self.mode.value!r}")
        if not isinstance(self.allow_flex, bool):
            raise ConversionError(f"allow_flex must be a boolean, got {self.allow_flex!r}")

    @classmethod
    def allowed_keys(cls) -> tuple[str, ...]:
        """Names accepted by `from_mapping`, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> TfliteOptions:
        """Build options from a plain mapping (config section, JSON), refusing unknown keys.

        Args:
            values: must hold `mode`; may hold any other field of `TfliteOptions`.

        Returns:
            The validated options.

        Raises:
            ConversionError: a key is unknown (the message names it and the allowed keys), `mode` is
                missing, or a value is invalid.
        """
        allowed = cls.allowed_keys()
        unknown = sorted(str(key) for key in values if key not in allowed)
        if unknown:
            raise ConversionError(
                f"unknown TFLite option(s) {unknown}; allowed options are: {', '.join(allowed)}")
        if "mode" not in values:
            raise ConversionError(f"TFLite options need 'mode'; got keys {sorted(values)}")
        return cls(**dict(values))

    def to_mapping(self) -> dict[str, Any]:
        """The options as JSON-ready values (`mode` as its string value); inverse of `from_mapping`."""
        return {
            "mode": self.mode.value,
            "representative_samples": self.representative_samples,
            "int8_io": self.int8_io,
            "allow_flex": self.allow_flex,
        }

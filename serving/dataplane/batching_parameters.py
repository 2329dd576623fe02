"""TF Serving's BatchingParameters: the knobs of `serving.dataplane.batching.Batched`, and their text format."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfship.core.errors import ConfigError


@dataclass(frozen=True)
class BatchingParameters:
    """TF Serving's batching knobs.

    Attributes:
        max_batch_size: most rows in one backend call.
        batch_timeout_micros: longest a batch waits to fill (while other batches run or peers are in
            flight), microseconds.
        max_enqueued_batches: queue capacity, in batches of `max_batch_size` rows; beyond it RESOURCE_EXHAUSTED.
        num_batch_threads: batches run concurrently.
        allowed_batch_sizes: if set, batches are padded to the next size (last must equal max_batch_size).
        pad_variable_length_inputs: zero-pad non-batch dims so requests of different lengths merge.
        enable_large_batch_splitting: split a request above max_batch_size (else INVALID_ARGUMENT).
    """

    max_batch_size: int = 32
    batch_timeout_micros: int = 1000
    max_enqueued_batches: int = 100
    num_batch_threads: int = 2
    allowed_batch_sizes: tuple[int, ...] = ()
    pad_variable_length_inputs: bool = False
    enable_large_batch_splitting: bool = True

    def __post_init__(self) -> None:
        if min(self.max_batch_size, self.max_enqueued_batches, self.num_batch_threads) < 1 \
                or self.batch_timeout_micros < 0:
            raise ConfigError(f"batching parameters must be positive: {self}")
        sizes = self.allowed_batch_sizes
        if sizes and (list(sizes) != sorted(set(sizes)) or sizes[-1] != self.max_batch_size or sizes[0] < 1):
            raise ConfigError(f"allowed_batch_sizes {list(sizes)} must increase and end with max_batch_size "
                              f"{self.max_batch_size} (TF Serving's rule)")

    @classmethod
    def from_text(cls, text: str, source: str = "<text>") -> BatchingParameters:
        """Parse TF Serving's BatchingParameters text format (`max_batch_size { value: 128 }`, ...)."""
        values: dict = {}
        body = re.sub(r"#.*", "", text)
        for name, value in re.findall(r"(\w+)\s*\{\s*value\s*:\s*([^\s}]+)\s*\}", body):
            values[name] = value
        body = re.sub(r"\w+\s*\{[^}]*\}", "", body)
        for name, value in re.findall(r"(\w+)\s*:\s*(\S+)", body):
            if name == "allowed_batch_sizes":
                values.setdefault(name, []).append(value)
            else:
                values[name] = value
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown batching parameter(s) {unknown}; known: {sorted(known)}")
        try:
            flags = ("pad_variable_length_inputs", "enable_large_batch_splitting")
            kwargs: dict[str, Any] = {k: (tuple(int(x) for x in v) if k == "allowed_batch_sizes"
                          else v.lower() == "true" if k in flags
                          else int(v)) for k, v in values.items()}
        except ValueError as err:
            raise ConfigError(f"{source}: bad batching parameter value: {err}") from err
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: Path) -> BatchingParameters:
        """Read `--batching_parameters_file`; raises `ConfigError` naming the file."""
        try:
            return cls.from_text(Path(path).read_text(encoding="utf-8"), str(path))
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"cannot read batching parameters file {path}: {err}") from err

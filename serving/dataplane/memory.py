"""Bounding and returning the memory one request causes.

`estimate_request_bytes` is the data plane's admission check: decoded inputs plus the outputs the signature
will produce for that many rows, compared with `--max-request-memory-bytes` before the model runs.
`release_freed_memory` hands freed heap pages back to the OS after a large request: glibc keeps freed
blocks in its arenas (one per thread), so without it one large request pins its peak RSS for the life of
the process (measured: ~1 GB after one 65,536-row digits request).
`freeze_loaded_heap` and `collect_unloaded` keep Python's cyclic garbage collector off a loaded model's objects.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import math
from collections.abc import Mapping

import numpy as np

from tfship.core.contract import Signature

log = logging.getLogger(__name__)
_LIBC = None
STRING_ITEM_BYTES = 64  # what one string element is counted as when estimating (its size is not known ahead)


def _libc():
    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        try:
            _LIBC = ctypes.CDLL(name) if name else False
        except OSError:
            _LIBC = False
        if _LIBC and not hasattr(_LIBC, "malloc_trim"):  # musl and others: nothing to trim
            _LIBC = False
    return _LIBC


def release_freed_memory() -> None:
    """`malloc_trim(0)`: return free heap pages of every glibc arena to the OS (no-op elsewhere). Blocking;
    call it off the event loop.
    """
    libc = _libc()
    if libc:
        libc.malloc_trim(0)


def freeze_loaded_heap() -> None:
    """After a version loaded: collect once, then move every object left into the collector's permanent
    generation (`gc.freeze`). A loaded TensorFlow holds millions of Python objects; each full collection walked
    them all, a 20-30 ms pause of the event loop every few seconds under load, which set the heavy model's p99
    at 3.7x its p50 (34 vs 9 ms; with the objects frozen 14 vs 8.5 ms, and 7 % more inferences/s:
    docs/benchmarks.md). Frozen objects are still freed by reference counting; only their cycles wait for
    `collect_unloaded`. Blocking (a full collection); call it off the event loop.
    """
    gc.collect()
    gc.freeze()


def collect_unloaded() -> None:
    """After a version unloaded: collect its reference cycles (TensorFlow's loaded objects hold some), frozen
    ones included (`gc.unfreeze` first), then freeze what is left again. Blocking; call it off the event loop.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()


# Item sizes of TensorFlow dtypes numpy does not hold (contract names, `core.dtypes`); anything else unknown
# (resource, variant, quantized, 2- and 4-bit) counts one byte: the estimate is a lower bound.
_TF_ONLY_ITEM_BYTES = {"bfloat16": 2, "qint16": 2, "quint16": 2, "qint32": 4}


def item_bytes(dtype: str) -> int:
    """Bytes one element of contract dtype `dtype` is counted as (strings: `STRING_ITEM_BYTES`)."""
    if dtype == "string":
        return STRING_ITEM_BYTES
    try:
        return np.dtype(dtype).itemsize
    except TypeError:  # a TensorFlow-only dtype (bfloat16, float8_*, int4, resource, ...)
        return _TF_ONLY_ITEM_BYTES.get(dtype, 1)


def estimate_request_bytes(signature: Signature, inputs: Mapping[str, np.ndarray], rows: int | None) -> int:
    """Bytes one Predict holds at least: its decoded inputs plus its outputs for `rows` rows (dim 0).

    Outputs are counted from the signature: each known dim as is, the batch dim as `rows`, other unknown
    dims as 1 (a lower bound). Strings count `STRING_ITEM_BYTES` per element.
    """
    total = 0
    for array in inputs.values():
        total += array.size * (STRING_ITEM_BYTES if array.dtype == object else array.itemsize)
    for spec in signature.outputs.values():
        if spec.shape is None:
            continue
        dims = [(rows or 1) if i == 0 and d is None else (d or 1) for i, d in enumerate(spec.shape)]
        total += math.prod(dims) * item_bytes(spec.dtype)
    return total

"""Refusing a request for what it declares, before its values are decoded.

A 64 MB Predict of 2,000,000 rows used to be parsed, copied into the helper process and decoded in full, only
to be refused for the row limit afterwards; four such requests at once held about 3 GB. Every API declares its
tensors' shapes ahead of their values (a `TensorProto`'s `tensor_shape`, an Open Inference input's `shape`, the
length of a REST `instances` list), so the per-request limits (`ServerLimits.max_batch_per_request`,
`max_request_memory_bytes`) are judged on those declarations first, against the served signature, with the same
messages the data plane gives after decoding (`DataPlane._predict` raises the same errors once the values are
known). What the declarations cannot tell (dtypes, the values' count) is still checked after decoding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tfship.core.contract import Signature
from tfship.core.errors import InvalidRequestError, ResourceExhaustedError
from tfship.serving.dataplane.memory import item_bytes


def rows_over_limit(rows: int, limit: int) -> InvalidRequestError:
    """The error of a batch (dim 0) of `rows` above --max-batch-per-request `limit`."""
    return InvalidRequestError(f"batch of {rows} rows exceeds the per-request limit of {limit}")


def memory_over_limit(held: int, rows: int | None, cap: int) -> ResourceExhaustedError:
    """The error of a request that needs `held` bytes, above --max-request-memory-bytes `cap`."""
    return ResourceExhaustedError(f"request needs at least {held} bytes for its inputs and outputs ({rows} rows), "
                                  f"above --max-request-memory-bytes {cap}; send fewer rows")


def batched_inputs(signature: Signature) -> tuple[str, ...]:
    """Names of `signature`'s inputs whose dim 0 is the batch (declared unknown), in signature order."""
    return tuple(name for name, spec in signature.inputs.items() if spec.shape and spec.shape[0] is None)


def declared_rows(batched: Sequence[str], shapes: Mapping[str, Sequence[int]]) -> int | None:
    """The batch a request declares: dim 0 of the first of `batched` it sends with rank >= 1 (else None).

    Args:
        batched: the signature's batched inputs (`batched_inputs`).
        shapes: input name -> declared dims, as the request states them (not yet checked).
    """
    for name in batched:
        dims = shapes.get(name)
        if dims is not None and len(dims) > 0:
            return int(dims[0])
    return None


def check_declared(signature: Signature | None, shapes: Mapping[str, Sequence[int]], max_rows: int,
                   memory_cap: int) -> None:
    """Refuse a request by its declared shapes, before its values are decoded.

    Args:
        signature: the signature the request targets; None (unknown signature) checks nothing, as the error
            that names it comes later from the data plane.
        shapes: input name -> declared dims (inputs the signature does not have are ignored here).
        max_rows: --max-batch-per-request (0 = unlimited).
        memory_cap: --max-request-memory-bytes (0 = unlimited); declared inputs plus the signature's outputs
            for that many rows, counted as `memory.estimate_request_bytes` counts decoded ones.

    Raises:
        InvalidRequestError: the declared batch exceeds `max_rows` (`rows_over_limit`).
        ResourceExhaustedError: the declared tensors exceed `memory_cap` (`memory_over_limit`).
    """
    if signature is None:
        return
    batched, items, per_row, fixed = _plan(signature)
    rows = declared_rows(batched, shapes)
    if max_rows and rows is not None and rows > max_rows:
        raise rows_over_limit(rows, max_rows)
    if not memory_cap:
        return
    held = (rows or 1) * per_row + fixed
    for name, dims in shapes.items():
        item = items.get(name)
        if item is not None and all(d >= 0 for d in dims):
            held += math.prod(int(d) for d in dims) * item
    if held > memory_cap:
        raise memory_over_limit(held, rows, memory_cap)


_PLANS: dict[int, tuple] = {}  # id(signature) -> (signature, its `_plan`)


def _plan(signature: Signature) -> tuple[tuple[str, ...], dict[str, int], int, int]:
    """What `check_declared` needs of `signature`, worked out once per signature object: its batched inputs, each
    input's item bytes, and its outputs' bytes per row (dim 0 declared unknown) and fixed bytes (the rest; an
    unknown or 0 dim past the first counts 1).
    """
    known = _PLANS.get(id(signature))
    if known is not None and known[0] is signature:
        return known[1]
    per_row = fixed = 0
    for spec in signature.outputs.values():
        if spec.shape is not None:
            size = math.prod(d or 1 for i, d in enumerate(spec.shape) if i or d is not None) * item_bytes(spec.dtype)
            if spec.shape and spec.shape[0] is None:
                per_row += size
            else:
                fixed += size
    plan = (batched_inputs(signature), {n: item_bytes(s.dtype) for n, s in signature.inputs.items()}, per_row, fixed)
    if len(_PLANS) >= 256:
        _PLANS.clear()
    _PLANS[id(signature)] = (signature, plan)
    return plan

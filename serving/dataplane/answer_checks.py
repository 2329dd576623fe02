"""Checks of a Predict's answer the data plane applies: output_filter aliases and the response's size."""

from __future__ import annotations

from tfship.core.echo import clip, echo_list
from tfship.core.errors import InvalidRequestError, ResourceExhaustedError


def check_response_size(outputs: dict, limit: int) -> None:
    """Refuse outputs whose raw bytes alone exceed --max-message-bytes (no transport could send them); each
    transport checks its exact encoded size too.
    """
    size = 0
    for array in outputs.values():
        size += sum(len(v) for v in array.reshape(-1)) if array.dtype == object else array.nbytes
    if size > limit:
        raise ResourceExhaustedError(f"response of at least {size} bytes exceeds --max-message-bytes {limit} bytes; "
                                     "ask for fewer rows or fewer outputs (output_filter)")


def check_output_filter(signature, output_filter: tuple[str, ...]) -> None:
    """Every `output_filter` alias names an output of `signature`, once (TF Serving: INVALID_ARGUMENT)."""
    unknown = sorted(set(output_filter) - set(signature.outputs))
    if unknown:
        raise InvalidRequestError(f"output tensor alias not found in signature: {clip(unknown[0])} Outputs expected "
                                  f"to be in the set {{{','.join(sorted(signature.outputs))}}}. (output_filter "
                                  f"{echo_list(unknown)} not in signature {signature.name!r})")  # TF Serving's words
    if len(set(output_filter)) != len(output_filter):
        twice = next(k for k in output_filter if output_filter.count(k) > 1)
        raise InvalidRequestError(f"duplicate output tensor alias: {clip(twice)} (output_filter names it twice)")

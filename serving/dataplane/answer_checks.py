"""Checks of a Predict's answer the data plane applies: output_filter aliases and the response's size."""

from __future__ import annotations

from tfship.core.echo import echo_list
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
        raise InvalidRequestError(f"output_filter {echo_list(unknown)} not in signature {signature.name!r} outputs "
                                  f"{sorted(signature.outputs)}")
    if len(set(output_filter)) != len(output_filter):
        raise InvalidRequestError(f"output_filter {echo_list(output_filter)} names an output twice")

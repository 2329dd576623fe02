"""The one vocabulary of conversion outcomes, shared by the converters (`tflite`, `tfjs`) and the pipeline.

It lives on the bottom floor because the converters may not import the pipeline above them;
`pipeline.conversion.artifacts` re-exports it.
"""

from __future__ import annotations

import enum


class ConversionStatus(enum.StrEnum):
    """A conversion's outcome (`VariantOutcome.status`, `TfliteConversionResult.status`,
    `TfjsConversionResult.status`, and the `status` field of the converter workers' JSON reports).

    A `StrEnum`: members compare equal to, and serialise to JSON as, their words.
    """

    PRODUCED = "produced"  # the artifact was written and passed its own runtime's check
    REFUSED = "refused"  # the converter or the check declined, with a reason
    CRASHED = "crashed"  # a child process died, timed out or wrote no report

"""The tolerance a published version's manifest records for an artifact, applied to a served answer.

The parity gate writes each output's bound as text (`pipeline.gate.compare.Tolerance.describe`): e.g.
`atol 0.1*21.9 + rtol 0 + 2x reference noise 4.8e-06 (up to 0.1 % of the output's elements may exceed it:
validate.int8.outlier_fraction)`. A served answer is
within the published tolerance when at most that share of its elements lie beyond
atol * scale + rtol * |want| + multiplier * noise (elementwise), with the numbers the manifest published.
Shared by the `--artifact` test (tests/pipeline) and the container tests (tests/deploy).
"""

from __future__ import annotations

import re

import numpy as np

TOLERANCE = re.compile(r"atol (?P<atol>\S+)\*(?P<scale>\S+) \+ rtol (?P<rtol>\S+)"
                       r"(?: \+ (?P<mult>\S+)x reference noise (?P<noise>\S+))?"
                       r"(?: \(up to (?P<share>\S+) % of (?:elements beyond|the output's elements may exceed it: "
                       r"\S+)\))?")  # the earlier wording, in manifests published before, and the current one


def beyond_published_tolerance(got: np.ndarray, want: np.ndarray, tolerance: str) -> tuple[int, int]:
    """(elements of `got` beyond the published bound around `want`, elements the bound lets lie beyond it).

    Raises:
        AssertionError: `tolerance` is not the gate's text for a float bound.
    """
    match = TOLERANCE.fullmatch(tolerance)
    assert match, f"unrecognised published tolerance {tolerance!r}"
    number = {key: float(value) if value else 0.0 for key, value in match.groupdict().items()}
    bound = number["atol"] * number["scale"] + number["rtol"] * np.abs(want) + number["mult"] * number["noise"]
    beyond = int(np.count_nonzero(np.abs(np.asarray(got, np.float64) - want) > bound))
    return beyond, int(number["share"] / 100 * np.size(want))


def check_published_parity(got: dict[str, np.ndarray], want: dict[str, np.ndarray], manifest: dict,
                           artifact: str) -> int:
    """Assert every float output of `got` lies within what `manifest` published for `artifact` against `want`
    (the SavedModel's answers); returns how many outputs were judged. Exact outputs (class ids) are left to the
    caller: the gate judges a quantized artifact's decisions with rules of its own.
    """
    parity = next(a for a in manifest["parity"]["artifacts"] if a["artifact"] == artifact)
    judged = 0
    for output in parity["outputs"]:
        if output["exact"]:
            continue
        beyond, allowed = beyond_published_tolerance(got[output["output"]], want[output["output"]],
                                                     output["tolerance"])
        assert beyond <= allowed, f"{artifact} {output['output']}: {beyond} elements beyond {output['tolerance']}"
        judged += 1
    return judged

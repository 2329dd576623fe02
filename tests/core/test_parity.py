"""`core.parity.compare_pair` judges a pair as the gate's `compare_outputs` does (same arrays, same bound, noise 0).

Each case is a pair the gate passes or fails for a stated reason; the serving floor's primitive must give the same
verdict per output, so a shadow report and the offline gate never disagree on what "agrees" means.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfship.core.parity import PairBound, compare_pair
from tfship.pipeline.gate.compare import Tolerance, compare_outputs

BOUND = PairBound(1e-5, 1e-5)
GATE = Tolerance(1e-5, 1e-5)


def _scores(rows: int = 32, classes: int = 10, seed: int = 0) -> np.ndarray:
    logits = np.random.default_rng(seed).normal(0, 3, (rows, classes)).astype(np.float32)
    return logits


def _cases():
    logits = _scores()
    out = {"logits": logits, "class_id": logits.argmax(axis=1).astype(np.int64)}
    yield "equal", out, dict(out), True
    shifted = {**out, "logits": logits + np.float32(1e-6)}
    yield "within the bound", shifted, out, True
    far = logits.copy()
    far[3, 2] += 0.01
    yield "one value outside", {**out, "logits": far}, out, False
    # a 12.6-range output allows 12.6x the absolute error (scale = max |want|)
    big = np.full((4, 3), 12.6, np.float32)
    yield "range-scaled bound", {"y": big + np.float32(1e-4)}, {"y": big}, True
    yield "NaN fails", {"y": np.array([[np.nan, 1.0]], np.float32)}, {"y": np.ones((1, 2), np.float32)}, False
    yield "shape differs", {"y": np.ones((2, 3), np.float32)}, {"y": np.ones((2, 2), np.float32)}, False
    yield "missing output", {"z": np.ones(2, np.float32)}, {"y": np.ones(2, np.float32)}, False
    yield "strings equal as text", {"s": np.array([b"a", b"b"], object)}, {"s": np.array(["a", "b"], object)}, True
    yield "strings differ", {"s": np.array([b"a", b"c"], object)}, {"s": np.array([b"a", b"b"], object)}, False
    # an index output into a tie: the two scores it may pick are equal within the bound, so it agrees
    tied = np.array([[1.0, 1.0 + 1e-7, 0.0], [0.0, 2.0, 1.0]], np.float32)
    primary = {"p": tied, "k": tied.argmax(axis=1).astype(np.int64)}
    yield "index tie agrees", {"p": tied, "k": np.array([0, 1], np.int64)}, primary, True
    yield "index flip fails", {"p": tied, "k": np.array([1, 0], np.int64)}, primary, False
    yield "plain integers exact", {"n": np.array([1, 2, 4])}, {"n": np.array([1, 2, 3])}, False


@pytest.mark.parametrize(("case", "got", "want", "expected"), list(_cases()), ids=[c[0] for c in _cases()])
def test_verdict_matches_the_gate(case, got, want, expected) -> None:
    ours = {row.output: row.within_bound for row in compare_pair(got, want, BOUND)}
    gate = {row.output: row.passed for row in compare_outputs(got, want, GATE)}
    assert ours == gate, case
    assert all(v is expected for v in ours.values()) or (not expected and not all(ours.values())), case


def test_top1_counts_flips_and_excuses_ties() -> None:
    """A flip counts against top-1 unless the primary's two scores are equal within their bounds (a tie)."""
    want = np.array([[3.0, 1.0, 0.0], [0.0, 1.0, 1.0 + 1e-6], [5.0, 0.0, 0.0]], np.float32)
    flipped = want.copy()
    flipped[0] = [0.0, 3.0, 0.0]  # the primary's margin is 2.0: a real flip, even as the only row of a pair
    row = compare_pair({"s": flipped[:1]}, {"s": want[:1]}, BOUND)[0]
    assert (row.rows, row.top1_agreeing, row.within_bound) == (1, 0, False)
    tied = want.copy()
    tied[1] = [0.0, 1.0 + 1e-6, 1.0]  # margin 1e-6 against bounds of about 1e-4 together: a tie
    row = compare_pair({"s": tied}, {"s": want}, BOUND)[0]
    assert row.top1_agreeing == 3
    assert compare_pair({"s": np.concatenate([flipped[:1], tied[1:]])}, {"s": want}, BOUND)[0].top1_agreeing == 2
    same = compare_pair({"s": want}, {"s": want}, BOUND)[0]
    assert same.top1_agreeing == 3 and same.within_bound and same.max_abs_error == 0.0


def test_nonfinite_values_are_judged_against_the_primarys() -> None:
    """A primary's NaN/Inf (a client's NaN input) repeated by the shadow agrees; the shadow's own NaN where the
    primary is finite, or a primary's NaN the shadow does not repeat, fails and is no top-1 agreement."""
    logits = _scores()
    primary = logits.copy()
    primary[1, :] = np.nan
    primary[2, 0], primary[2, 1] = np.inf, -np.inf
    (same,) = compare_pair({"y": primary.copy()}, {"y": primary})
    assert same.within_bound and same.top1_agreeing == same.rows and same.max_abs_error == 0.0, same
    own_nan = primary.copy()
    own_nan[0, 0] = np.nan
    (bad,) = compare_pair({"y": own_nan}, {"y": primary})
    assert not bad.within_bound and bad.top1_agreeing == bad.rows - 1
    assert "NaN or Inf in the shadow's output where the primary's is finite (1 values)" in bad.detail
    flipped_inf = primary.copy()
    flipped_inf[2, 0] = -np.inf
    (wrong,) = compare_pair({"y": flipped_inf}, {"y": primary})
    assert not wrong.within_bound and wrong.top1_agreeing == wrong.rows - 1
    assert "1 of the primary's NaN/Inf values not repeated by the shadow" in wrong.detail
    finite = logits.copy()
    finite[1, :] = 0.0  # the primary's NaN row answered with numbers: not the primary's answer
    (numbers,) = compare_pair({"y": finite}, {"y": primary})
    assert not numbers.within_bound and numbers.top1_agreeing == numbers.rows - 2

"""The shadow report's arithmetic: parts merge as if one process had seen every pair, quantiles keep their
stated bound, and each promotion floor refuses its bad case and passes the good one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tfship.core.parity import PairBound, compare_pair
from tfship.serving.dataplane.shadow_report import ShadowReport, _add, check_floors, merge, quantile

RNG = np.random.default_rng(3)


def _pairs(count: int, flip_every: int = 0):
    for i in range(count):
        want = RNG.normal(0, 1, (8, 5)).astype(np.float32)
        got = want + RNG.normal(0, 1e-7, want.shape).astype(np.float32)
        if flip_every and i % flip_every == 0:
            top, low = int(np.argmax(want[0])), int(np.argmin(want[0]))
            got[0, top], got[0, low] = want[0, low], want[0, top]  # row 0's top class swapped with its lowest
        yield compare_pair({"scores": got}, {"scores": want}, PairBound()), float(RNG.uniform(1e-4, 1e-2))


def _fill(whole: ShadowReport, parts: list[ShadowReport], count: int, flip_every: int = 0, version: int = 2) -> None:
    """Record `count` pairs into `whole`, and each also into one of `parts` in turn (the workers)."""
    for i, (compared, seconds) in enumerate(_pairs(count, flip_every)):
        for report in (whole, parts[i % len(parts)]) if parts else (whole,):
            report.record_pair(compared, 1, version, seconds, 2 * seconds)


def test_parts_merge_as_one_process() -> None:
    whole, left, right = (ShadowReport("m", "canary") for _ in range(3))
    _fill(whole, [left, right], 60, flip_every=7)
    whole.record_error("INTERNAL")
    left.record_error("INTERNAL")
    right.record_dropped("queue_full")
    whole.record_dropped("queue_full")
    merged = merge([json.loads(json.dumps(left.to_json())), json.loads(json.dumps(right.to_json()))])  # via files
    one = whole.to_json()
    assert merged["figures"] == one["figures"]
    assert merged["errors"] == one["errors"] and merged["dropped"] == one["dropped"]
    assert [w["max_error"] for w in merged["worst"]] == [w["max_error"] for w in one["worst"]]
    with pytest.raises(ValueError, match="different models"):
        merge([left.to_json(), ShadowReport("other", "2").to_json()])


def test_quantiles_are_never_below_and_at_most_1_26x_above() -> None:
    values = RNG.lognormal(-6, 2, 5000)
    histogram: dict[int, int] = {}
    for value in values:
        _add(histogram, float(value))
    for q in (0.5, 0.99):
        true = float(np.quantile(values, q, method="inverted_cdf"))
        assert true <= quantile(histogram, q) <= true * 10 ** 0.1 * (1 + 1e-9)


def test_error_p99_never_shows_above_the_max() -> None:
    """Every pair off by the same 0.0105: its histogram bin ends at 10**-1.9 = 0.0126, above any error seen, so the
    bin's edge alone would report p99 1.2x the max; clamped, p99 is the max. A spread of errors keeps the
    histogram's p99 below the max (the clamp changes nothing there)."""
    same = ShadowReport("m", "canary")
    want = np.zeros((4, 3), np.float32)
    for _ in range(20):
        same.record_pair(compare_pair({"y": want + np.float32(0.0105)}, {"y": want}, PairBound()), 1, 2, 0.01, 0.01)
    figures = same.to_json()["figures"]["outputs"]["y"]
    assert quantile(same.to_json()["outputs"]["y"]["errors"], 0.99) > figures["max_error"]  # the bin edge
    assert figures["p99_error"] == figures["max_error"] == pytest.approx(0.0105, rel=1e-5)
    spread = ShadowReport("m", "canary")
    for error in [np.float32(0.01)] * 199 + [np.float32(1.0)]:  # one outlier: p99 is the bulk's bin, max the outlier
        spread.record_pair(compare_pair({"y": want + error}, {"y": want}, PairBound()), 1, 2, 0.01, 0.01)
    figures = spread.to_json()["figures"]["outputs"]["y"]
    assert figures["p99_error"] == pytest.approx(0.01, rel=0.26) and figures["max_error"] == 1.0


def _report(count: int, flip_every: int = 0, version: int = 2) -> dict:
    report = ShadowReport("m", "canary")
    _fill(report, [], count, flip_every, version)
    return report.to_json()


def test_each_floor_refuses_its_bad_case() -> None:
    good = _report(50)
    assert check_floors(good, 2, 50, 0.99, 0.99) == []
    assert "fewer than the 51 required" in check_floors(good, 2, 51, 0.99, 0.99)[0]
    assert "not 3" in check_floors(good, 3, 50, 0.99, 0.99)[0]
    flipped = _report(50, flip_every=2)  # 25 of 400 rows flip: 93.75 % top-1
    reasons = check_floors(flipped, 2, 50, 0.99, 0.0)
    assert reasons == ["top-1 agreement 93.75% below the floor 99.00%"]
    assert check_floors(flipped, 2, 50, 0.9, 0.0) == []
    assert "value agreement 50.00% of pairs below the floor 99.00%" in check_floors(flipped, 2, 50, 0.9, 0.99)[0]
    errored = ShadowReport("m", "canary")
    _fill(errored, [], 50)
    errored.record_error("DEADLINE_EXCEEDED")
    assert check_floors(errored.to_json(), 2, 50, 0.99, 0.99) == ["1 shadow error(s): {'DEADLINE_EXCEEDED': 1}"]
    assert "no pair was answered" in check_floors(ShadowReport("m", "2").to_json(), 2, 0, 0.99, 0.99)[0]


def test_queue_is_bounded_in_pairs_and_bytes() -> None:
    """Pairs beyond `queue_size`, or whose arrays would take the queue past `queue_bytes`, are dropped and
    counted; those within both bounds are queued (the workers are stopped: nothing leaves the queue)."""
    from tfship.serving.dataplane.shadow import ShadowOptions, Shadows
    from tfship.serving.dataplane.types import ModelRef

    def shadows(**options) -> Shadows:
        made = Shadows(object(), {"m": ModelRef("m", label="canary")}, ShadowOptions(rate=1.0, **options))
        made._stop.set()
        for thread in made._threads:
            thread.join()
        return made

    small = {"x": np.zeros((1, 256), np.float32)}  # 1 KiB
    by_count = shadows(queue_size=3)
    for _ in range(5):
        by_count.offer("m", 1, "serving_default", small, small, 0.001, None)
    assert by_count._queue.qsize() == 3 and by_count.reports["m"].dropped == {"queue_full": 2}
    by_bytes = shadows(queue_size=100, queue_bytes=5 * 2048)  # five pairs of 2 KiB (inputs + outputs)
    for _ in range(8):
        by_bytes.offer("m", 1, "serving_default", small, small, 0.001, None)
    assert by_bytes._queue.qsize() == 5 and by_bytes.reports["m"].dropped == {"queue_full": 3}
    big = {"x": np.zeros((1, 4096), np.float32)}  # 16 KiB: alone above the bound
    by_bytes._queue.get_nowait()
    by_bytes._unqueue(2048)
    by_bytes.offer("m", 1, "serving_default", big, big, 0.001, None)
    assert by_bytes._queue.qsize() == 4 and by_bytes.reports["m"].dropped == {"queue_full": 4}

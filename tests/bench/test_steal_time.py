"""The mixed-load benchmark's steal-time guard: what a window lost to the hypervisor, and the re-runs.

`host_cpu_ticks` is read from this machine's real /proc/stat; `_run_unstolen`'s retry rule is checked on the
results a window would report (the load generators themselves are run by tests/bench/test_loadgen_smoke.py).
"""

from __future__ import annotations

import sys

import pytest

from bench.serve import mixed_load
from bench.serve.server_counters import host_cpu_ticks, steal_share


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_host_ticks_are_read_from_proc_stat() -> None:
    first = host_cpu_ticks()
    assert first is not None
    steal, total = first
    assert 0 <= steal <= total
    second = host_cpu_ticks()
    assert second[1] >= total and second[0] >= steal


def test_steal_share_is_the_stolen_part_of_the_ticks_between_two_readings() -> None:
    assert steal_share((100, 1_000), (130, 1_300)) == pytest.approx(0.1)
    assert steal_share((100, 1_000), (100, 1_600)) == 0.0
    assert steal_share(None, (1, 2)) is None
    assert steal_share((5, 10), (5, 10)) is None  # no tick between the readings: nothing measured


@pytest.mark.parametrize(("steals", "tries"), [([0.0], 1), ([0.3, 0.02], 2), ([0.5, 0.4, 0.3, 0.2], 4)],
                         ids=["quiet", "one-stolen-window", "stolen-every-time"])
def test_stolen_windows_are_run_again_at_most_steal_retries_times(monkeypatch, steals, tries) -> None:
    calls = []

    def window(server, loads, files, warmup_s, window_s, work):
        steal = steals[len(calls)]
        calls.append(steal)
        return [{"requests_per_s": 100.0 * len(calls), "host_steal": steal} for _ in loads]

    monkeypatch.setattr(mixed_load, "_run", window)
    results = mixed_load._run_unstolen(None, [("a", "grpc", 1), ("b", "rest", 1)], {}, 0.0, 1.0, None)
    assert len(calls) == tries == min(len(steals), mixed_load.STEAL_RETRIES + 1)
    assert [r["steal_retries"] for r in results] == [tries - 1] * 2
    assert results[0]["requests_per_s"] == 100.0 * tries  # the last window is the one reported

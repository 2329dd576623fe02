"""`core.warm_children`: jobs run one after another in a warm child, and each job keeps a fresh process's
isolation. A job that kills its child, hangs, raises or exits non-zero costs that job only (reported as
`run_converter_child` reports it) and the next job gets a fresh child; a good job hands its child on; no child
outlives the block. The probe worker is `tests/core/warm_probe.py`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tfship.core.processes import pid_running, run_converter_child
from tfship.core.warm_children import run_warm_or_cold, warm_children

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc are Linux's")
ROOT = Path(__file__).resolve().parents[2]
PROBE = [sys.executable, "-m", "tests.core.warm_probe"]


def _run(*argv: str, report: Path | None = None, timeout_s: float = 60.0):
    return run_warm_or_cold([*PROBE, *argv], "probe worker", timeout_s, report=report, cwd=ROOT)


def test_good_jobs_share_one_child_and_a_crash_costs_only_its_job(tmp_path):
    with warm_children() as pool:
        first = _run("ok", str(tmp_path / "1"), report=tmp_path / "1")
        second = _run("ok", str(tmp_path / "2"), report=tmp_path / "2")
        assert first.failure == second.failure == "", (first, second)
        warm_pid = int((tmp_path / "1").read_text())
        assert int((tmp_path / "2").read_text()) == warm_pid and pool.started == 1  # one start, two jobs
        killed = _run("kill")
        assert killed.returncode == -9 and "probe worker died with SIGKILL (signal 9)" in killed.failure, killed
        assert f"probe kill in {warm_pid}" in killed.failure  # the output tail is this job's
        assert "probe ok" not in killed.output  # and only this job's
        after = _run("ok", str(tmp_path / "3"), report=tmp_path / "3")
        assert after.failure == "" and int((tmp_path / "3").read_text()) != warm_pid  # restarted
        assert pool.started == 2 and not pid_running(warm_pid)
        living = pool.pids()
    assert living and not any(pid_running(pid) for pid in living)  # closing the block leaves no child


def test_a_hang_is_timed_out_and_killed_and_the_next_job_runs(tmp_path):
    with warm_children() as pool:
        assert _run("ok", str(tmp_path / "1"), report=tmp_path / "1").failure == ""
        warm_pid = int((tmp_path / "1").read_text())
        started = time.monotonic()
        hung = _run("hang", timeout_s=2.0)
        assert 2.0 <= time.monotonic() - started < 10.0
        assert hung.returncode is None and hung.failure == (
            "timed out after 2 s in the probe worker (worker killed with SIGKILL)"), hung
        assert not pid_running(warm_pid)
        assert _run("ok", str(tmp_path / "2"), report=tmp_path / "2").failure == ""
        assert pool.started == 2


@pytest.mark.parametrize(("argv", "words"), [(("raise",), ["exited with status 1", "the probe raised on purpose"]),
                                             (("exit", "3"), ["exited with status 3"])])
def test_a_failing_job_is_reported_with_its_output_and_its_child_retired(tmp_path, argv, words):
    with warm_children() as pool:
        failed = _run(*argv)
        assert all(word in failed.failure for word in words), failed
        assert _run("ok", str(tmp_path / "r"), report=tmp_path / "r").failure == ""
        assert pool.started == 2  # the failed job's child is not trusted with the next job


def test_a_job_without_its_report_fails(tmp_path):
    with warm_children():
        done = _run("ok", str(tmp_path / "written"), report=tmp_path / "not-written")
    assert "exited with status 0 and no report" in done.failure, done


def test_outcomes_read_as_a_fresh_processs(tmp_path):
    """The same failure sentence warm and cold (the callers match on it)."""
    cold = run_converter_child([*PROBE, "kill"], "probe worker", 60.0, cwd=ROOT)
    with warm_children():
        warm = _run("kill")
    assert cold.failure.split(";")[0] == warm.failure.split(";")[0] == "probe worker died with SIGKILL (signal 9)"


def test_peak_is_the_jobs_own_high_water_mark(tmp_path):
    """Each job's peak is measured from the resident set at its start: a 200 MiB job does not inflate the next."""
    with warm_children() as pool:
        big = _run("grow", str(tmp_path / "big"), "200", report=tmp_path / "big")
        small = _run("ok", str(tmp_path / "small"), report=tmp_path / "small")
        assert pool.started == 1
    assert big.peak_rss_bytes >= 200 * 2**20, big
    assert small.peak_rss_bytes < big.peak_rss_bytes - 150 * 2**20, (small.peak_rss_bytes, big.peak_rss_bytes)


def test_without_a_block_each_command_is_a_fresh_process(tmp_path):
    for name in ("1", "2"):
        assert _run("ok", str(tmp_path / name), report=tmp_path / name).failure == ""
    assert (tmp_path / "1").read_text() != (tmp_path / "2").read_text()


def test_children_die_with_a_killed_parent(tmp_path):
    """kill -9 of the process holding the block: its warm child gets SIGKILL from the kernel (no orphan)."""
    import subprocess
    import textwrap

    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from tfship.core.warm_children import run_warm_or_cold, warm_children
        with warm_children():
            run_warm_or_cold({PROBE!r} + ["ok", {str(tmp_path / "pid")!r}], "probe", 60, cwd={str(ROOT)!r})
            print("ready", flush=True)
            time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert parent.stdout.readline().strip() == "ready"
        child = int((tmp_path / "pid").read_text())
        assert pid_running(child)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 5
    while pid_running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_running(child)

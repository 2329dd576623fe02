"""`make reliability`'s summary: verdicts and the JSON + Markdown table (the attacks themselves run in
`make reliability`; the same attacks, shorter, are the serving tests' regression tests)."""

from __future__ import annotations

import json

from bench.reliability.common import Row
from bench.reliability.run import _write


def test_row_verdicts_and_report(tmp_path):
    passed, failed, skipped = Row("a", "ok attack"), Row("b", "bad attack"), Row("c", "skipped: no time")
    for _ in range(3):
        passed.check(True, "never")
    failed.check(True, "")
    failed.check(False, "first reason")
    assert (passed.verdict, failed.verdict, skipped.verdict) == ("pass", "FAIL", "FAIL")
    _write(tmp_path, [passed, failed, skipped], 12.3, quick=True, seed=0)
    data = json.loads((tmp_path / "reliability-latest.json").read_text())
    assert [(r["attack"], r["tried"], r["failed"], r["verdict"]) for r in data["rows"]] == [
        ("a", 3, 0, "pass"), ("b", 2, 1, "FAIL"), ("c", 0, 0, "skipped")]
    table = (tmp_path / "reliability-latest.md").read_text()
    assert "| b | bad attack | 2 | 1 | FAIL |" in table and "first reason" in table and "shared machine" in table

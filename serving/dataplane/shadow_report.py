"""The running parity report of one shadowed model: what `serving.dataplane.shadow` records for each pair.

Every figure is kept in a mergeable form (counts, maxima, log-binned histograms), so the parts written by each
`--num-processes` worker add up to one report (`merge`) exactly as if one process had seen every pair. Quantiles
(p50, p99) are read from histograms whose bins are a tenth of a decade wide: a quantile is reported as the upper
edge of its bin, so it is never below the true value and at most 10**0.1 = 1.26x above it; an error quantile is
also clamped to the output's exact maximum, so p99 never shows above max.

JSON layout (`to_json`): `model`, `shadow` (the target as configured), `pairs`, `rows`, `value_agreeing_pairs`,
`outputs` {name: {max_error, errors (histogram), within_bound_pairs, top1_rows, top1_agreeing}}, `latency_s`
{primary, shadow: histograms in seconds}, `errors` {gRPC status: count}, `dropped` {reason: count},
`versions` {primary: {version: pairs}, shadow: {...}}, `worst` (up to `WORST_KEPT` pairs, largest excess first),
`figures` (the derived rates and quantiles, `figures()`).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from tfship.core.parity import OutputPair

BINS_PER_DECADE = 10
WORST_KEPT = 10  # the sample of worst disagreements each report keeps


def _bin(value: float) -> int:
    """Histogram bin of a non-negative value: 0 holds 0 (and anything below 1e-12); k > 0 holds values up to
    10**((k - 121) / 10), i.e. bin 121 ends at 1.0; inf lands in the last bin (`math.inf` edge).
    """
    if value <= 1e-12:
        return 0
    if math.isinf(value) or math.isnan(value):
        return 10_000
    return max(1, math.ceil(BINS_PER_DECADE * math.log10(value)) + 121)


def _edge(index: int) -> float:
    if index == 0:
        return 0.0
    if index >= 10_000:
        return math.inf
    return 10.0 ** ((index - 121) / BINS_PER_DECADE)


def quantile(histogram: dict[int, int], q: float) -> float | None:
    """Upper edge of the bin holding the `q` quantile (0 < q <= 1) of a `_bin` histogram; None when empty."""
    total = sum(histogram.values())
    if not total:
        return None
    rank, seen = q * total, 0
    for index in sorted(histogram):
        seen += histogram[index]
        if seen >= rank:
            return _edge(index)
    return _edge(max(histogram))


def _add(histogram: dict[int, int], value: float) -> None:
    index = _bin(value)
    histogram[index] = histogram.get(index, 0) + 1


def _merge_histograms(parts: Iterable[dict]) -> dict[int, int]:
    out: Counter = Counter()
    for part in parts:
        out.update({int(k): int(v) for k, v in part.items()})
    return dict(out)


class ShadowReport:
    """Thread-safe running report of one model's shadowed pairs (layout: module docstring).

    Args:
        model: the served model's name.  shadow: the shadow target as configured (`canary`, `3`).
        keep_inputs: whether the worst-disagreement sample keeps the request's inputs (default off: privacy).
    """

    def __init__(self, model: str, shadow: str, keep_inputs: bool = False) -> None:
        self.model, self.shadow, self.keep_inputs = model, shadow, keep_inputs
        self._lock = threading.Lock()
        self.pairs = self.rows = self.value_agreeing_pairs = 0
        self.outputs: dict[str, dict[str, Any]] = {}
        self.latency: dict[str, dict[int, int]] = {"primary": {}, "shadow": {}}
        self.errors: Counter = Counter()
        self.dropped: Counter = Counter()
        self.versions: dict[str, Counter] = {"primary": Counter(), "shadow": Counter()}
        self.worst: list[dict[str, Any]] = []
        self.changed = 0  # bumped on every change (the file writer writes only when it moved)

    def record_pair(self, compared: tuple[OutputPair, ...], primary_version: int, shadow_version: int,
                    primary_s: float, shadow_s: float, inputs: dict | None = None) -> None:
        """Add one compared pair: each output's row (`core.parity.compare_pair`), versions, latencies (s)."""
        with self._lock:
            self.pairs += 1
            self.rows += max((row.rows for row in compared), default=0)
            self.value_agreeing_pairs += all(row.within_bound for row in compared)
            for row in compared:
                entry = self.outputs.setdefault(row.output, {"max_error": 0.0, "errors": {}, "within_bound_pairs": 0,
                                                             "top1_rows": 0, "top1_agreeing": 0})
                entry["max_error"] = max(entry["max_error"], row.max_abs_error)
                _add(entry["errors"], row.max_abs_error)
                entry["within_bound_pairs"] += row.within_bound
                if row.top1_agreeing is not None:
                    entry["top1_rows"] += row.rows
                    entry["top1_agreeing"] += row.top1_agreeing
            _add(self.latency["primary"], primary_s)
            _add(self.latency["shadow"], shadow_s)
            self.versions["primary"][str(primary_version)] += 1
            self.versions["shadow"][str(shadow_version)] += 1
            worst = max(compared, key=lambda r: r.excess, default=None)
            if worst is not None and not all(r.within_bound and r.top1_agreeing in (None, r.rows) for r in compared):
                self._keep_worst(worst, compared, primary_version, shadow_version, inputs)
            self.changed += 1

    def _keep_worst(self, worst: OutputPair, compared, primary_version: int, shadow_version: int,
                    inputs: dict | None) -> None:
        entry = {"at": time.time(), "output": worst.output, "max_error": worst.max_abs_error, "excess": worst.excess,
                 "primary_version": primary_version, "shadow_version": shadow_version, "rows": worst.rows,
                 "detail": "; ".join(f"{r.output}: {r.detail}" for r in compared if r.detail),
                 "top1_disagreeing": {r.output: r.rows - r.top1_agreeing for r in compared
                                      if r.top1_agreeing is not None and r.top1_agreeing < r.rows}}
        if self.keep_inputs and inputs is not None:
            entry["inputs"] = {k: v.tolist() for k, v in inputs.items()}
        self.worst = _worst_of([*self.worst, entry])

    def record_error(self, status: str) -> None:
        """The shadow failed with `status` (a gRPC code name: UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, ...)."""
        with self._lock:
            self.errors[status] += 1
            self.changed += 1

    def record_dropped(self, reason: str) -> None:
        """A sampled request was not shadowed: `queue_full`, `deadline_passed`, `same_version`."""
        with self._lock:
            self.dropped[reason] += 1
            self.changed += 1

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data, with its derived `figures`."""
        with self._lock:
            payload = {"model": self.model, "shadow": self.shadow, "pairs": self.pairs, "rows": self.rows,
                       "value_agreeing_pairs": self.value_agreeing_pairs,
                       "outputs": {k: {**v, "errors": dict(v["errors"])} for k, v in self.outputs.items()},
                       "latency_s": {k: dict(v) for k, v in self.latency.items()},
                       "errors": dict(self.errors), "dropped": dict(self.dropped),
                       "versions": {k: dict(v) for k, v in self.versions.items()}, "worst": list(self.worst)}
        return with_figures(payload)


def _worst_of(entries: list[dict]) -> list[dict]:
    return sorted(entries, key=lambda e: (-float(e["excess"]), -float(e["max_error"])))[:WORST_KEPT]


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from several (each worker's part, `ShadowReport.to_json`) of the same model: counts add up,
    maxima take the largest, histograms add bin by bin, the worst samples are pooled and cut to `WORST_KEPT`.

    Raises:
        ValueError: no parts, or parts of different models.
    """
    if not parts:
        raise ValueError("no shadow report to merge")
    models = {p["model"] for p in parts}
    if len(models) != 1:
        raise ValueError(f"shadow reports of different models cannot merge: {sorted(models)}")
    outputs: dict[str, dict] = {}
    for part in parts:
        for name, entry in part["outputs"].items():
            into = outputs.setdefault(name, {"max_error": 0.0, "errors": [], "within_bound_pairs": 0, "top1_rows": 0,
                                             "top1_agreeing": 0})
            into["max_error"] = max(into["max_error"], float(entry["max_error"]))
            into["errors"].append(entry["errors"])
            for key in ("within_bound_pairs", "top1_rows", "top1_agreeing"):
                into[key] += int(entry[key])
    for entry in outputs.values():
        entry["errors"] = _merge_histograms(entry["errors"])

    def counted(key: str) -> dict:
        total: Counter = Counter()
        for part in parts:
            total.update(part[key])
        return dict(total)

    payload = {"model": parts[0]["model"], "shadow": parts[0]["shadow"],
               **{k: sum(int(p[k]) for p in parts) for k in ("pairs", "rows", "value_agreeing_pairs")},
               "outputs": outputs,
               "latency_s": {k: _merge_histograms(p["latency_s"][k] for p in parts) for k in ("primary", "shadow")},
               "errors": counted("errors"), "dropped": counted("dropped"),
               "versions": {k: dict(sum((Counter(p["versions"][k]) for p in parts), Counter()))
                            for k in ("primary", "shadow")},
               "worst": _worst_of([w for p in parts for w in p["worst"]]), "parts": len(parts)}
    return with_figures(payload)


def with_figures(payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` plus `figures`: top-1 agreement (the lowest over decision outputs, fraction of rows), value
    agreement (fraction of pairs with every output within the bound), per-output max and p99 error, both
    versions' p50/p99 latency (seconds), shadow errors and drops in all.
    """
    pairs = payload["pairs"]
    decided = [e for e in payload["outputs"].values() if e["top1_rows"]]
    per_output = {name: {"max_error": e["max_error"], "p99_error": _within_max(quantile(_keys_int(e["errors"]), 0.99),
                                                                               e["max_error"]),
                         "value_agreement": e["within_bound_pairs"] / pairs if pairs else None,
                         "top1_agreement": e["top1_agreeing"] / e["top1_rows"] if e["top1_rows"] else None}
                  for name, e in payload["outputs"].items()}
    latency = {k: {"p50": quantile(_keys_int(v), 0.5), "p99": quantile(_keys_int(v), 0.99)}
               for k, v in payload["latency_s"].items()}
    payload["figures"] = {
        "pairs": pairs,
        "top1_agreement": min((e["top1_agreeing"] / e["top1_rows"] for e in decided), default=None),
        "value_agreement": payload["value_agreeing_pairs"] / pairs if pairs else None,
        "outputs": per_output, "latency_s": latency,
        "shadow_errors": sum(payload["errors"].values()), "dropped": sum(payload["dropped"].values()),
        "shadow_versions": sorted(int(v) for v in payload["versions"]["shadow"]),
    }
    return payload


def _within_max(value: float | None, maximum: float) -> float | None:
    """A histogram quantile clamped to the exact maximum: the bin's upper edge can pass the largest value seen
    (an error of 0.0105 lies in the bin ending at 0.0126), and no quantile exceeds the maximum, so the clamp
    keeps the quantile an upper bound of the true one and never shows p99 above max.
    """
    return None if value is None else min(value, maximum)


def _keys_int(histogram: dict) -> dict[int, int]:
    return {int(k): int(v) for k, v in histogram.items()}


def check_floors(report: dict[str, Any], version: int, min_pairs: int, min_top1: float,
                 min_value_agreement: float) -> list[str]:
    """Why `report` does not prove `version` (every reason, with the figures); empty when it does.

    Floors: at least `min_pairs` pairs compared, all of them answered by `version` (the shadow must be the
    candidate being promoted), top-1 agreement >= `min_top1` and value agreement >= `min_value_agreement`
    (fractions in [0, 1]), and no shadow error.
    """
    figures = report.get("figures") or with_figures(dict(report))["figures"]
    reasons = []
    if figures["pairs"] < min_pairs:
        reasons.append(f"{figures['pairs']} pairs compared, fewer than the {min_pairs} required")
    if figures["shadow_versions"] and figures["shadow_versions"] != [version]:
        reasons.append(f"the shadow answered as version(s) {figures['shadow_versions']}, not {version}")
    elif not figures["shadow_versions"]:
        reasons.append(f"no pair was answered by version {version}")
    top1, value = figures["top1_agreement"], figures["value_agreement"]
    if top1 is not None and top1 < min_top1:
        reasons.append(f"top-1 agreement {top1:.2%} below the floor {min_top1:.2%}")
    if value is not None and value < min_value_agreement:
        worst = max(figures["outputs"].items(), key=lambda kv: kv[1]["max_error"], default=None)
        reasons.append(f"value agreement {value:.2%} of pairs below the floor {min_value_agreement:.2%}"
                       + (f" (largest error {worst[1]['max_error']:.3g} on output '{worst[0]}')"
                          if worst is not None and worst[0] else ""))
    if figures["shadow_errors"]:
        reasons.append(f"{figures['shadow_errors']} shadow error(s): {report.get('errors')}")
    return reasons

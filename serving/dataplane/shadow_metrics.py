"""The shadow reports as Prometheus metrics (prometheus_client's custom-collector API), read at scrape time.

Each process exports its own part (a `--num-processes` server has one scrape target per worker, and Prometheus
adds them up); the counters are the report's own counts, so nothing per pair touches prometheus_client.

    tfship_shadow_pairs_total{model}                       pairs compared
    tfship_shadow_rows_total{model}                        rows compared
    tfship_shadow_value_agreeing_pairs_total{model}        pairs with every output within the value bound
    tfship_shadow_top1_rows_total{model,output}            rows of decision outputs compared
    tfship_shadow_top1_agreeing_rows_total{model,output}   ... whose top-1 agreed (ties counted as agreeing)
    tfship_shadow_max_error{model,output}                  largest |shadow - primary| seen
    tfship_shadow_errors_total{model,status}               shadow calls failed, by gRPC status
    tfship_shadow_dropped_total{model,reason}              sampled requests not shadowed: queue_full, ...
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric


class ShadowCollector:
    """Collector over a `serving.dataplane.shadow.Shadows` (register it on the server's registry)."""

    def __init__(self, shadows) -> None:
        self._shadows = shadows

    def collect(self) -> Iterator[Metric]:
        """prometheus_client collector protocol."""
        pairs = CounterMetricFamily("tfship_shadow_pairs", "Shadowed pairs compared.", labels=["model"])
        rows = CounterMetricFamily("tfship_shadow_rows", "Rows of shadowed pairs compared.", labels=["model"])
        value = CounterMetricFamily("tfship_shadow_value_agreeing_pairs", "Pairs with every output within the "
                                    "value bound.", labels=["model"])
        top1_rows = CounterMetricFamily("tfship_shadow_top1_rows", "Rows of decision outputs compared.",
                                        labels=["model", "output"])
        top1 = CounterMetricFamily("tfship_shadow_top1_agreeing_rows", "Rows whose top-1 agreed (ties agree).",
                                   labels=["model", "output"])
        max_error = GaugeMetricFamily("tfship_shadow_max_error", "Largest |shadow - primary| per output.",
                                      labels=["model", "output"])
        errors = CounterMetricFamily("tfship_shadow_errors", "Shadow calls failed, by status.",
                                     labels=["model", "status"])
        dropped = CounterMetricFamily("tfship_shadow_dropped", "Sampled requests not shadowed, by reason.",
                                      labels=["model", "reason"])
        for model, report in self._shadows.reports.items():
            payload = report.to_json()
            pairs.add_metric([model], payload["pairs"])
            rows.add_metric([model], payload["rows"])
            value.add_metric([model], payload["value_agreeing_pairs"])
            for name, entry in payload["outputs"].items():
                max_error.add_metric([model, name], entry["max_error"])
                if entry["top1_rows"]:
                    top1_rows.add_metric([model, name], entry["top1_rows"])
                    top1.add_metric([model, name], entry["top1_agreeing"])
            for status, count in payload["errors"].items():
                errors.add_metric([model, status], count)
            for reason, count in payload["dropped"].items():
                dropped.add_metric([model, reason], count)
        yield from (pairs, rows, value, top1_rows, top1, max_error, errors, dropped)

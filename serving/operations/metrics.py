"""Prometheus metrics for the server, on a private registry (no global state)."""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = CONTENT_TYPE_LATEST
# prometheus_client's own switch for the `_created` series, read the way it reads it
_CREATED_SERIES = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in ("true", "1", "t")
LATENCY_BUCKETS_S = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)


class RequestStats:
    """`tfship_requests_total` and `tfship_request_latency_seconds`, kept as plain numbers per request.

    The two metrics every request updates: `record()` adds 1 to a count and the latency to a histogram
    under one lock (about a tenth of what three prometheus_client `inc()`s cost per request), and
    `collect()` turns them into samples at scrape time through prometheus_client's custom-collector
    API, so the exposition (names, labels, cumulative `le` buckets, `_sum`, `_count`, `_created` unless
    PROMETHEUS_DISABLE_CREATED_SERIES is set) is the library's.

    Args:
        buckets_s: upper bounds of the latency buckets, seconds, ascending (`+Inf` is added).
    """

    def __init__(self, buckets_s: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self._bounds = tuple(float(b) for b in buckets_s)
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str, str, str], int] = {}
        self._latency: dict[tuple[str, str], list] = {}  # (model, method) -> [per-bucket counts, sum seconds]
        self._created: dict[tuple, float] = {}  # label values -> when the series began (time.time() seconds)

    def record(self, model: str, version: str, method: str, status: str, seconds: float) -> None:
        """Count one request (status: gRPC code name) that took `seconds`."""
        key = (model, version, method, status)
        bucket = bisect.bisect_left(self._bounds, seconds)  # first bound >= seconds; len(bounds) = +Inf
        with self._lock:
            count = self._counts.get(key)
            if count is None:
                count = 0
                self._created[key] = time.time()
            self._counts[key] = count + 1
            latency = self._latency.get((model, method))
            if latency is None:
                latency = self._latency[(model, method)] = [[0] * (len(self._bounds) + 1), 0.0]
                self._created[(model, method)] = time.time()
            latency[0][bucket] += 1
            latency[1] += seconds

    def collect(self) -> Iterator[Metric]:
        """prometheus_client collector protocol: one counter and one histogram family."""
        with self._lock:
            counts = list(self._counts.items())
            latency = [(key, list(buckets), total) for key, (buckets, total) in self._latency.items()]
            created = dict(self._created) if _CREATED_SERIES else {}
        requests = CounterMetricFamily("tfship_requests", "Requests by model, version, method and status code.",
                                       labels=["model", "version", "method", "status"])
        for labels, value in counts:
            requests.add_metric(list(labels), value, created=created.get(labels))
        yield requests
        histogram = HistogramMetricFamily("tfship_request_latency_seconds", "Request latency in seconds.",
                                          labels=["model", "method"])
        for labels, buckets, total in latency:
            running, cumulative = 0, []
            for bound, n in zip((*(floatToGoString(b) for b in self._bounds), "+Inf"), buckets):
                running += n
                cumulative.append((bound, running))
            histogram.add_metric(list(labels), cumulative, total)
            if labels in created:  # as prometheus_client's Histogram: <name>_created per label set
                histogram.add_sample("tfship_request_latency_seconds_created", dict(zip(("model", "method"), labels)),
                                     created[labels])
        yield histogram


class Metrics:
    """Request counts, latency (seconds), batch sizes (rows), queue depth, event-loop lag (seconds) and load
    events.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = RequestStats()
        self.registry.register(self.requests)
        self.batch_size = Histogram("tfship_batch_size", "Rows per backend call (after batching).",
                                    ["model"], registry=self.registry,
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
        self.queue_depth = Gauge("tfship_batch_queue_depth", "Requests waiting in batch queues.",
                                 ["model"], registry=self.registry)
        self.inflight = Gauge("tfship_inflight_requests", "Predict requests being served.", registry=self.registry)
        self.loop_lag = Histogram("tfship_event_loop_lag_seconds",
                                  "How late each transport's event loop runs a timer, in seconds (`loop`: grpc, "
                                  "which also runs the data plane, or rest); a loop starved by load shows here.",
                                  ["loop"], registry=self.registry,
                                  buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0))
        self.load_events = Counter("tfship_model_load_events", "Version load/unload events by outcome.",
                                   ["model", "event"], registry=self.registry)

    def render(self) -> bytes:
        """Text exposition format of every metric."""
        return generate_latest(self.registry)

"""Prometheus metrics for the server, on a private registry (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """Request counts, latency (seconds), batch sizes (rows), queue depth and load events."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("tfship_requests", "Requests by model, version, method and status code.",
                                ["model", "version", "method", "status"], registry=self.registry)
        self.latency = Histogram("tfship_request_latency_seconds", "Request latency in seconds.",
                                 ["model", "method"], registry=self.registry,
                                 buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        self.batch_size = Histogram("tfship_batch_size", "Rows per backend call (after batching).",
                                    ["model"], registry=self.registry,
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
        self.queue_depth = Gauge("tfship_batch_queue_depth", "Requests waiting in batch queues.",
                                 ["model"], registry=self.registry)
        self.inflight = Gauge("tfship_inflight_requests", "Predict requests being served.", registry=self.registry)
        self.load_events = Counter("tfship_model_load_events", "Version load/unload events by outcome.",
                                   ["model", "event"], registry=self.registry)

    def render(self) -> bytes:
        """Text exposition format of every metric."""
        return generate_latest(self.registry)

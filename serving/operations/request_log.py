"""Request logging: one structured line per sampled request (off by default), like TF Serving's request
logging (`logging_config { sampling_config { sampling_rate } }`), written as a log line instead of
PredictionLog files.

Each transport's single error-mapping point (gRPC `serving.grpc_calls.rpc`, the REST middleware) opens a record when the
request is sampled and writes it when the answer is known; the data plane adds what only it knows
(model version, signature, batch rows) through `note_request()`. A line (logger `tfship.requests`, INFO) is a
JSON object:

    {"protocol": "grpc", "method": "Predict", "model": "digits", "version": "2",
     "signature": "serving_default", "status": "OK", "http_status": 200, "latency_ms": 1.93,
     "batch_rows": 5, "peer": "ipv4:127.0.0.1:50110"}

`status` is the gRPC code name (REST answers carry both it and `http_status`); fields unknown for a
request (e.g. version when the model does not exist) are empty strings / null. A model that is not served is
logged as `__unknown__` (as the metrics label it) and every text field is cut to `core.echo.ECHO_CHARS`, so
a client cannot make a line longer than about 2 KB.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field

from tfship.core.echo import clip

log = logging.getLogger("tfship.requests")
UNKNOWN_MODEL_LABEL = "__unknown__"  # what requests naming a model that is not served are logged and counted as
_CURRENT: ContextVar[RequestRecord | None] = ContextVar("tfship_request_record", default=None)
# gRPC code name -> HTTP status, for gRPC answers (TF Serving's REST mapping, core/errors' table).
_HTTP_OF = {"OK": 200, "INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "OUT_OF_RANGE": 400,
            "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403, "NOT_FOUND": 404, "ALREADY_EXISTS": 409,
            "ABORTED": 409, "RESOURCE_EXHAUSTED": 429, "CANCELLED": 499, "INTERNAL": 500, "UNKNOWN": 500,
            "DATA_LOSS": 500, "UNIMPLEMENTED": 501, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504}


@dataclass
class RequestRecord:
    """What one request's line says; filled by the transport (protocol, method, peer, status) and the
    data plane (model, version, signature, batch_rows).
    """

    protocol: str
    method: str
    model: str = ""
    version: str = ""
    signature: str = ""
    status: str = ""
    http_status: int | None = None
    latency_ms: float = 0.0
    batch_rows: int | None = None
    peer: str = ""
    trace_id: str = ""  # the OpenTelemetry trace id when tracing is on (serving.operations.tracing)
    started: float = field(default_factory=time.perf_counter, repr=False)


def note_request(**fields) -> None:
    """Add fields (model, version, signature, batch_rows) to the current request's record, if it is sampled."""
    record = _CURRENT.get()
    if record is not None:
        for key, value in fields.items():
            if value not in (None, ""):
                setattr(record, key, value)


class RequestLog:
    """Writes one JSON line per sampled request.

    Args:
        sampling_rate: fraction of requests logged, in [0, 1]; 0 = off (default), 1 = every request.
        seed: random seed of the sampler (tests); None = unpredictable.
        served: tells whether a model name is served (the server sets the model manager's `is_configured`);
            other names are logged as `UNKNOWN_MODEL_LABEL`. None: every name is logged (cut).

    Raises:
        ValueError: `sampling_rate` outside [0, 1].
    """

    def __init__(self, sampling_rate: float = 0.0, seed: int | None = None,
                 served: Callable[[str], bool] | None = None) -> None:
        if not 0.0 <= sampling_rate <= 1.0:
            raise ValueError(f"request log sampling rate {sampling_rate} is not in [0, 1]")
        self.sampling_rate = sampling_rate
        self._random = random.Random(seed)
        self.served = served

    def start(self, protocol: str, method: str, peer: str = "", model: str = ""):
        """Open a record for this request when it is sampled; returns a token for `finish` (None: not sampled)."""
        if self.sampling_rate <= 0.0 or (self.sampling_rate < 1.0 and self._random.random() >= self.sampling_rate):
            return None
        record = RequestRecord(protocol, method, model=model, peer=peer)
        return record, _CURRENT.set(record)

    def finish(self, token, status: str, http_status: int | None = None) -> None:
        """Write the line of a request opened by `start` (no-op for None) with its final status."""
        if token is None:
            return
        record, reset = token
        _CURRENT.reset(reset)
        record.status = status
        record.http_status = http_status if http_status is not None else _HTTP_OF.get(status, 500)
        record.latency_ms = round((time.perf_counter() - record.started) * 1000.0, 3)
        if record.model and self.served is not None and not self.served(record.model):
            record.model = UNKNOWN_MODEL_LABEL
        fields = {key: clip(value) if isinstance(value, str) else value for key, value in asdict(record).items()}
        del fields["started"]
        log.info(json.dumps(fields), extra={"request": fields})

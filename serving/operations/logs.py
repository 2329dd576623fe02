"""Logging setup for the server entry point (plain or one JSON object per line)."""

from __future__ import annotations

import json
import logging
import sys


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and exception text if any (request-log lines
    carry their fields at the top level).
    """

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                 "message": record.getMessage()}
        request = getattr(record, "request", None)
        if isinstance(request, dict):  # a request-log line: its fields at the top level, not inside "message"
            entry["message"] = "request"
            entry.update(request)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(json_logs: bool = False, level: int = logging.INFO) -> None:
    """Configure the root logger to stderr (called once, by the serve entry point only)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_logs else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)

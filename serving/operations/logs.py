"""Logging setup for the server entry point (plain or one JSON object per line)."""

from __future__ import annotations

import json
import logging
import sys

from aiohttp import http_exceptions

from tfship.core.echo import clip

MALFORMED_REQUEST_LOGGER = "aiohttp.server"  # where aiohttp reports a request it could not parse


class MalformedRequestFilter(logging.Filter):
    """aiohttp logs every HTTP request it cannot parse (a request line past 8,190 bytes, a NUL in a header, an
    absurd Content-Length) at ERROR with a traceback quoting the bad bytes, although the client was answered 400
    and nothing failed on the server. This filter turns such a record into one WARNING line naming the error,
    its text cut to 200 characters (`core.echo.clip`); other records pass unchanged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, http_exceptions.HttpProcessingError):
            reason = " ".join(str(error.message).split())
            record.msg, record.args = "%s; answered HTTP %s: %s: %s", (
                record.getMessage(), error.code, type(error).__name__, clip(reason))
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info = record.exc_text = None
        return True


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
    server_log = logging.getLogger(MALFORMED_REQUEST_LOGGER)
    if not any(isinstance(f, MalformedRequestFilter) for f in server_log.filters):
        server_log.addFilter(MalformedRequestFilter())

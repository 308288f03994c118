"""JSON-line logging for the balancer (process-wide: called once, from the command)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any, TextIO


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, msg, and the record's ``fields`` extra."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send ``gpugate.*`` logs as JSON lines to ``stream`` (stderr by default)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("gpugate")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False

"""JSON-line logs: one object per line, so a log pipeline needs no parser of ours. Process-wide.

Every gpugate process (the admission server and gunicorn's own records when ``serve`` installs
``LOGCONFIG``, the balancer through ``configure``) writes records with ``JSONFormatter``: ``ts``,
``level``, ``logger``, ``event``, ``pid`` (which worker) plus the record's ``fields`` dict.
The admission server logs exactly one ``admission`` line per review it answers, with its uid.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

import orjson

ADMISSION_LOGGER = "gpugate.admission"
SERVER_LOGGER = "gpugate.server"


class JSONFormatter(logging.Formatter):
    """Render a record as one JSON object; structured data comes from ``extra={"fields": {...}}``."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            "pid": record.process,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


# A dictConfig for gunicorn's ``logconfig_dict`` and for ``gpugate serve``'s own loggers.
LOGCONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "webhook.logs.JSONFormatter"}},
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"},
    },
    "loggers": {
        "gunicorn.error": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
        "gunicorn.access": {"level": "WARNING", "handlers": ["stderr"], "propagate": False},
        "gpugate": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
    },
    "root": {"level": "WARNING", "handlers": ["stderr"]},
}


def log_admission(logger: logging.Logger, fields: Mapping[str, Any]) -> None:
    """The one line per admission: uid, namespace, pod, policy, revision, patch_ops, result, duration."""
    logger.info("admission", extra={"fields": dict(fields)})


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    logger.log(level, event, extra={"fields": fields})


def configure(level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send ``gpugate.*`` logs as JSON lines to ``stream`` (stderr by default); called once per process."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JSONFormatter())
    logger = logging.getLogger("gpugate")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False

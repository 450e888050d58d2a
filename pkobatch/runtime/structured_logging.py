"""Controller logging: one JSON object per line (or readable text), with reconcile context.

JSON lines carry ``ts``, ``level``, ``logger``, ``msg`` — the keys Flux's ``flux logs``
parses — plus ``controllerKind``, ``namespace``, ``name`` and ``reconcileID`` while a worker
reconciles an object, ``error`` with the traceback for exceptions, and any ``extra={...}``
fields of the call. The worker sets the context (``reconcile_context``) around each
reconcile, so the reconciler logs through a plain ``logging.getLogger(__name__)`` and its
lines are tagged without passing anything around.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import IO, Any, Final

from pkobatch.runtime.interfaces import ObjectKey

_CONTEXT: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "pkobatch_reconcile", default=None
)
_STANDARD_ATTRIBUTES: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)
_LEVELS: Final = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


@contextlib.contextmanager
def reconcile_context(kind: str, key: ObjectKey, reconcile_id: str | None = None) -> Iterator[str]:
    """Tag every log line of this thread with the object (of ``kind``) and a fresh
    reconcile ID."""
    reconcile_id = reconcile_id or str(uuid.uuid4())
    token = _CONTEXT.set(
        {
            "controllerKind": kind,
            "namespace": key.namespace,
            "name": key.name,
            "reconcileID": reconcile_id,
        }
    )
    try:
        yield reconcile_id
    finally:
        _CONTEXT.reset(token)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields: dict[str, Any] = dict(_CONTEXT.get() or {})
    for name, value in vars(record).items():
        if name not in _STANDARD_ATTRIBUTES and not name.startswith("_"):
            fields[name] = value
    return fields


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(_fields(record))
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        text = f"{ts} {record.levelname:<7} {record.name}: {record.getMessage()}"
        fields = _fields(record)
        if fields:
            text += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def setup_logging(
    level: str = "info", log_format: str = "json", stream: IO[str] | None = None
) -> None:
    """Send all logs to ``stream`` (stderr) in ``log_format`` ("json" or "text") from
    ``level`` up."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(_LEVELS.get(level, logging.ERROR))
    # urllib3 logs every retry at WARNING with the full URL; our own messages say it better.
    logging.getLogger("urllib3").setLevel(logging.ERROR)

"""What the configured logging really writes: ``configure_logging`` pointed at a buffer.

The tests read the finished text, as a log collector or a terminal would get it, not the
records: redaction and the bound ids are only proven on the rendered lines.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import attrs
import structlog

from tradecore_entrypoints.logs import LOG_FORMATS, LogFormat, configure_logging

FORMATS: tuple[LogFormat, ...] = LOG_FORMATS


@attrs.define
class CapturedLogs:
    """The text written so far in ``log_format``."""

    log_format: LogFormat
    buffer: io.StringIO

    @property
    def text(self) -> str:
        return self.buffer.getvalue()

    def entries(self) -> list[dict[str, Any]]:
        """Every line as its JSON object (json format only; each line must be one)."""
        assert self.log_format == "json"
        return [json.loads(line) for line in self.text.splitlines()]

    def matching(self, **fields: object) -> list[dict[str, Any]]:
        """The JSON entries whose fields include ``fields``."""
        return [e for e in self.entries() if all(e.get(k) == v for k, v in fields.items())]


@contextlib.contextmanager
def captured_logs(log_format: LogFormat, level: int = logging.DEBUG) -> Iterator[CapturedLogs]:
    """Configure the process's logging to a buffer for the block, then put back the root
    logger's level and handlers and structlog's defaults."""
    root = logging.getLogger()
    saved_level, saved_handlers = root.level, list(root.handlers)
    buffer = io.StringIO()
    configure_logging(log_format, level=level, stream=buffer)
    try:
        yield CapturedLogs(log_format, buffer)
    finally:
        for handler in [h for h in root.handlers if h not in saved_handlers]:
            root.removeHandler(handler)
        for handler in saved_handlers:
            root.addHandler(handler)  # a no-op for those still there
        root.setLevel(saved_level)
        structlog.reset_defaults()

"""Where log lines go and how they look: every logger, through structlog, to standard error.

``configure_logging`` is the one place the process's logging is set up (the ``tradecore``
command calls it at start, and ``serve`` and ``worker`` again once ``LOG_FORMAT`` is read).
The code keeps logging through the standard library (``logging.getLogger(__name__)``; the core
may import nothing else), and so do aiohttp, psycopg and ccxt: one root handler formats every
record with structlog's ``ProcessorFormatter``, so all of them come out in one shape:

* ``json``: one JSON object a line, for a log collector: ``timestamp`` (UTC, ISO 8601),
  ``level``, ``logger``, ``message``, the ids bound for the request or the order
  (``request_id``, ``user_id``, ``account_id``, ``order_id``; ``tradecore.log_fields``),
  the fields a line passes itself (the access log's ``status``, ``duration_ms``...) and, after
  a failure, ``exception`` with the traceback as text;
* ``console``: the same fields as one readable line without colours, for a terminal.

Unset, the format is ``console`` when standard error is a terminal and ``json`` otherwise
(docs/decisions.md). Every line passes ``log_redaction.redact_secrets`` before it is rendered.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from tradecore.log_fields import LOG_FIELD_NAMES, current_log_fields
from tradecore_entrypoints.log_redaction import redact_secrets

LogFormat = Literal["json", "console"]
LOG_FORMATS: tuple[LogFormat, ...] = ("json", "console")


class _RootHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler ``configure_logging`` installs; a second call replaces it (and only it)."""


class _StderrRootHandler(_RootHandler):
    """Writes to whatever ``sys.stderr`` is when a line is written, not when it was made: a
    test runner or a daemon that swaps standard error never leaves it writing to a closed
    stream (the standard library's last-resort handler does the same)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _: TextIO) -> None:
        """``StreamHandler.__init__`` assigns a stream; this handler has none of its own."""


def parse_log_format(name: str, value: str) -> LogFormat:
    """The ``LOG_FORMAT`` setting: ``json`` or ``console``, in any case."""
    lowered = value.strip().lower()
    if lowered not in LOG_FORMATS:
        raise ValueError(f"{name} must be json or console")
    return lowered


def default_log_format(stream: TextIO) -> LogFormat:
    """``console`` for a terminal, ``json`` for anything else (a file, a pipe, a collector)."""
    isatty = getattr(stream, "isatty", None)
    return "console" if isatty is not None and isatty() else "json"


def add_log_fields(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """structlog processor: the ids bound in the context the line was written in; a field the
    line passes itself wins."""
    for name, value in current_log_fields().known().items():
        event_dict.setdefault(name, value)
    return event_dict


_LEADING_KEYS = ("timestamp", "level", "logger", "message", *LOG_FIELD_NAMES)


def _leading_keys_first(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """structlog processor: the time, level, logger, message and ids lead each JSON line (in
    that order), then the line's own fields as written."""
    leading = {key: event_dict[key] for key in _LEADING_KEYS if key in event_dict}
    return {**leading, **event_dict}


def _record_extras() -> list[Processor]:
    """The fields a stdlib line passes with ``extra=``. ``message`` and ``asctime`` are not
    among them: another handler's formatter may have left them on the record."""

    def drop_formatter_leftovers(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        event_dict.pop("message", None)
        event_dict.pop("asctime", None)
        return event_dict

    return [structlog.stdlib.ExtraAdder(), drop_formatter_leftovers]


def _shared_processors() -> list[Processor]:
    """What every line gets before rendering, whether a structlog or a stdlib logger wrote it."""
    return [
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_log_fields,
    ]


def _renderers(log_format: LogFormat) -> list[Processor]:
    """The last steps: exceptions as text, redaction, then the renderer."""
    steps: list[Processor] = [
        structlog.stdlib.ProcessorFormatter.remove_processors_meta,
        structlog.processors.format_exc_info,
        redact_secrets,
    ]
    if log_format == "json":
        return [
            *steps,
            structlog.processors.EventRenamer("message"),
            _leading_keys_first,
            structlog.processors.JSONRenderer(default=str),
        ]
    return [
        *steps,
        structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        ),
    ]


def configure_logging(
    log_format: LogFormat | None = None,
    *,
    level: int | str | None = None,
    stream: TextIO | None = None,
) -> None:
    """Send every log record to ``stream`` (standard error) in ``log_format`` (None: by
    ``default_log_format``), at ``level`` and above (None keeps the root logger's level).

    Idempotent: a later call replaces the handler an earlier one installed and leaves other
    handlers (a test's capture) in place."""
    chosen = log_format or default_log_format(sys.stderr if stream is None else stream)
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_record_extras(), *_shared_processors()],
        processors=_renderers(chosen),
    )
    handler = _StderrRootHandler() if stream is None else _RootHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _RootHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    if level is not None:
        root.setLevel(level.upper() if isinstance(level, str) else level)
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_shared_processors(),
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )

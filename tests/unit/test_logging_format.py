"""The two log formats, as written: one JSON object a line, or one readable line without
colours; the setting that chooses between them; the ids bound to a unit of work."""

from __future__ import annotations

import asyncio
import io
import logging
from datetime import datetime

import pytest
import structlog
from click.testing import CliRunner

from log_capture import FORMATS, captured_logs
from tradecore.log_fields import (
    LogFields,
    bind_log_fields,
    current_log_fields,
    log_fields_bound,
    start_log_fields,
)
from tradecore_entrypoints.cli import main
from tradecore_entrypoints.logs import configure_logging, default_log_format
from tradecore_entrypoints.settings import ConfigError, Settings

log = logging.getLogger("tradecore.test.logging")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_json_line_leads_with_time_level_logger_message_and_the_bound_ids() -> None:
    start_log_fields(LogFields(request_id="req-1"))
    bind_log_fields(user_id="u-1", account_id="a-1", order_id="o-1")
    with captured_logs("json") as logs:
        log.warning("order %s waits", "o-1", extra={"waited_s": 2.5})

    (entry,) = logs.entries()
    assert list(entry)[:8] == [
        "timestamp",
        "level",
        "logger",
        "message",
        "request_id",
        "user_id",
        "account_id",
        "order_id",
    ]
    assert entry["level"] == "warning"
    assert entry["logger"] == "tradecore.test.logging"
    assert entry["message"] == "order o-1 waits"
    assert (entry["request_id"], entry["user_id"], entry["account_id"], entry["order_id"]) == (
        "req-1",
        "u-1",
        "a-1",
        "o-1",
    )
    assert entry["waited_s"] == 2.5
    stamp = datetime.fromisoformat(entry["timestamp"])
    assert stamp.utcoffset() is not None and stamp.utcoffset().total_seconds() == 0


def test_a_json_line_leaves_out_ids_nobody_bound() -> None:
    with captured_logs("json") as logs:
        log.warning("nothing bound")

    (entry,) = logs.entries()
    assert not {"request_id", "user_id", "account_id", "order_id"} & set(entry)


def test_an_exception_is_one_json_line_with_the_traceback_as_text() -> None:
    with captured_logs("json") as logs:
        try:
            raise RuntimeError("the broker hung up")
        except RuntimeError:
            log.exception("execution failed")

    (entry,) = logs.entries()
    assert entry["level"] == "error"
    assert entry["exception"].startswith("Traceback (most recent call last):")
    assert entry["exception"].endswith("RuntimeError: the broker hung up")


def test_a_console_line_is_readable_and_without_colour() -> None:
    start_log_fields(LogFields(request_id="req-2", order_id="o-2"))
    with captured_logs("console") as logs:
        log.info("order %s executed: %s", "o-2", "filled")

    (line,) = logs.text.splitlines()
    assert "\x1b[" not in line
    assert "[info" in line and "order o-2 executed: filled" in line
    assert "[tradecore.test.logging]" in line
    assert "request_id=req-2" in line and "order_id=o-2" in line


@pytest.mark.parametrize("log_format", FORMATS)
def test_structlog_loggers_and_stdlib_loggers_write_the_same_shape(log_format: str) -> None:
    with captured_logs(log_format) as logs:  # type: ignore[arg-type]
        structlog.get_logger("tradecore.test.native").warning("native", attempt=2)
        log.warning("stdlib")

    if log_format == "json":
        native, stdlib = logs.entries()
        assert set(native) - {"attempt"} == set(stdlib)
        assert (native["message"], native["attempt"], native["logger"]) == (
            "native",
            2,
            "tradecore.test.native",
        )
    else:
        native_line, stdlib_line = logs.text.splitlines()
        assert "[warning" in native_line and "attempt=2" in native_line
        assert "[warning" in stdlib_line and "stdlib" in stdlib_line


def test_the_level_drops_lower_lines() -> None:
    with captured_logs("json", level=logging.WARNING) as logs:
        log.info("dropped")
        structlog.get_logger("tradecore.test.native").info("dropped too")
        log.warning("kept")

    assert [e["message"] for e in logs.entries()] == ["kept"]


def test_unset_the_format_follows_whether_standard_error_is_a_terminal() -> None:
    assert default_log_format(Terminal()) == "console"
    assert default_log_format(io.StringIO()) == "json"


def test_configuring_again_replaces_its_own_handler_and_keeps_others() -> None:
    root = logging.getLogger()
    other = logging.NullHandler()
    root.addHandler(other)
    try:
        first, second = io.StringIO(), io.StringIO()
        with captured_logs("json"):
            configure_logging("json", stream=first)
            configure_logging("console", stream=second)
            log.warning("once")
            assert other in root.handlers
        assert first.getvalue() == ""
        assert second.getvalue().count("once") == 1
    finally:
        root.removeHandler(other)


def test_log_format_is_a_setting() -> None:
    assert Settings.from_env({}).log_format is None
    assert Settings.from_env({"LOG_FORMAT": " JSON "}).log_format == "json"
    assert Settings.from_env({"LOG_FORMAT": "console"}).log_format == "console"
    with pytest.raises(ConfigError, match=r"^LOG_FORMAT must be json or console$"):
        Settings.from_env({"LOG_FORMAT": "xml"})


# --- the ids of a unit of work ---------------------------------------------------------------


def test_binding_adds_ids_and_a_block_restores_them() -> None:
    start_log_fields(LogFields(request_id="r"))
    bind_log_fields(user_id="u")
    bind_log_fields(order_id="o", user_id=None)  # None keeps what is bound
    assert current_log_fields() == LogFields(request_id="r", user_id="u", order_id="o")

    with log_fields_bound(LogFields(order_id="other")):
        assert current_log_fields() == LogFields(order_id="other")
        bind_log_fields(account_id="a")
    assert current_log_fields() == LogFields(request_id="r", user_id="u", order_id="o")


async def test_tasks_keep_their_own_ids() -> None:
    """Two requests served side by side (each in its own task) never see each other's ids."""
    with captured_logs("json") as logs:

        async def serve(request_id: str, order_id: str) -> None:
            start_log_fields(LogFields(request_id=request_id))
            await asyncio.sleep(0)
            bind_log_fields(order_id=order_id)
            await asyncio.sleep(0)
            log.warning("served")

        await asyncio.gather(
            asyncio.create_task(serve("r1", "o1")), asyncio.create_task(serve("r2", "o2"))
        )

    pairs = sorted((e["request_id"], e["order_id"]) for e in logs.entries())
    assert pairs == [("r1", "o1"), ("r2", "o2")]
    assert current_log_fields() == LogFields()


def test_a_bad_log_format_stops_serve_and_worker_with_one_line() -> None:
    root = logging.getLogger()
    saved_level, saved_handlers = root.level, list(root.handlers)
    try:
        for command in (["serve"], ["worker"]):
            env = {"LOG_FORMAT": "xml", "DATABASE_URL": "", "REDIS_URL": ""}
            result = CliRunner().invoke(main, command, env=env)
            assert result.exit_code == 2
            assert result.stderr == "tradecore: LOG_FORMAT must be json or console\n"
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        structlog.reset_defaults()

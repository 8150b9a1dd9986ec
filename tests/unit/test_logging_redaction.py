"""No secret reaches a written log line, in either format: by field name, by shape in any text
(the message and a traceback included), however a line was written."""

from __future__ import annotations

import logging

import pytest
import structlog

from log_capture import FORMATS, captured_logs
from tradecore_entrypoints.log_redaction import REDACTED, redact_text
from tradecore_entrypoints.logs import LogFormat

log = logging.getLogger("tradecore.test.redaction")

WEBHOOK_TOKEN = "Wh7kq2ZxTOKENvalue_9aB"
PASSWORD = "hunter2-Correct-Horse"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1LTEifQ.c2lnbmF0dXJlLXZhbHVl"
API_KEY = "tck_" + "K" * 43
BROKER_SECRET = "sEcReT-bRoKeR-42"
SESSION_COOKIE = "cookievalue-Zz9"
CSRF = "csrf-value-Qq7"

SECRETS = (WEBHOOK_TOKEN, PASSWORD, JWT, API_KEY, BROKER_SECRET, SESSION_COOKIE, CSRF)


def assert_no_secret(text: str) -> None:
    leaked = [secret for secret in SECRETS if secret in text]
    assert leaked == [], text


@pytest.mark.parametrize("log_format", FORMATS)
def test_fields_named_as_secrets_are_redacted_at_any_depth(log_format: LogFormat) -> None:
    with captured_logs(log_format) as logs:
        log.warning(
            "fields",
            extra={
                "password": PASSWORD,
                "webhook_token": WEBHOOK_TOKEN,
                "Authorization": f"Bearer {JWT}",
                "headers": {"Cookie": f"access_token={SESSION_COOKIE}", "X-CSRF-Token": CSRF},
                "credentials": {"api_key": "k", "api_secret": BROKER_SECRET},
                "attempts": [{"client_secret": BROKER_SECRET}],
            },
        )
        structlog.get_logger("tradecore.test.native").warning(
            "native", api_key=API_KEY, secret=BROKER_SECRET
        )

    assert_no_secret(logs.text)
    assert logs.text.count(REDACTED) >= 8
    if log_format == "json":
        stdlib, native = logs.entries()
        assert stdlib["password"] == REDACTED
        assert stdlib["headers"] == {"Cookie": REDACTED, "X-CSRF-Token": REDACTED}
        assert native["api_key"] == REDACTED


@pytest.mark.parametrize("log_format", FORMATS)
def test_secrets_of_a_known_shape_are_redacted_in_messages(log_format: LogFormat) -> None:
    with captured_logs(log_format) as logs:
        log.warning("POST /webhook/%s/order answered 401", WEBHOOK_TOKEN)
        log.warning("retrying https://tradecore.example/webhook/%s?x=1", WEBHOOK_TOKEN)
        log.warning("upstream said: Authorization: Bearer %s", JWT)
        log.warning("raw header Cookie: access_token=%s; refresh_token=x", SESSION_COOKIE)
        log.warning("a token %s in passing", JWT)
        log.warning("key %s was presented", API_KEY)
        log.warning("connecting to postgresql://app:%s@db:5432/tradecore", PASSWORD)
        log.warning("connecting to redis://:%s@cache:6379/0", PASSWORD)
        log.warning("GET /api/v3/account?timestamp=1&signature=%s", BROKER_SECRET)
        log.warning('venue answered {"apiKey": "k", "secret": "%s"}', BROKER_SECRET)
        log.warning("login failed password=%s", PASSWORD)

    assert_no_secret(logs.text)
    assert "/webhook/<token>/order" in logs.text


@pytest.mark.parametrize("log_format", FORMATS)
def test_a_traceback_is_redacted_too(log_format: LogFormat) -> None:
    with captured_logs(log_format) as logs:
        try:
            raise ConnectionError(f"cannot reach redis://:{PASSWORD}@cache:6379 (token={JWT})")
        except ConnectionError:
            log.exception("store unavailable")

    assert_no_secret(logs.text)
    assert "ConnectionError: cannot reach redis://" in logs.text.replace("\\n", "\n")


@pytest.mark.parametrize("log_format", FORMATS)
def test_an_object_is_redacted_as_its_text(log_format: LogFormat) -> None:
    class Dsn:
        def __str__(self) -> str:
            return f"postgresql://app:{PASSWORD}@db/tradecore"

    with captured_logs(log_format) as logs:
        log.warning("pool opened", extra={"dsn": Dsn()})

    assert_no_secret(logs.text)
    assert "postgresql://[redacted]@db/tradecore" in logs.text


def test_ordinary_text_is_left_alone() -> None:
    ordinary = [
        "worker of user u-1 lost its lease (token 12); stopping",
        "CSRF token missing",
        "order 0b6f: fill check 1: filled",
        "POST /webhook/<token>/order 200",
        "rate limiter unavailable (Timeout); admitting the request (fail open)",
    ]
    assert [redact_text(text) for text in ordinary] == ordinary


def test_redacting_twice_changes_nothing_more() -> None:
    text = (
        f"Authorization: Bearer {JWT} password={PASSWORD} redis://:{PASSWORD}@h "
        f"/webhook/{WEBHOOK_TOKEN} {API_KEY} 'secret': '{BROKER_SECRET}'"
    )
    once = redact_text(text)
    assert_no_secret(once)
    assert redact_text(once) == once

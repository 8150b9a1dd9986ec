"""A venue's refusals as the core's results: ``OrderError`` codes with the venue's own words.

The venue's error code (Binance's ``code``, Bybit's ``retCode``), when the table below knows
it, decides; otherwise the library's exception class does (ccxt's ``InsufficientFunds``,
``BadSymbol``, ``MarketClosed``...). The venue's message is kept as ``broker_message`` beside our
code and message, so a user can look it up at the venue. Refused credentials are not a result
but ``CredentialsRejected``; an unreachable or failing venue is ``BrokerDisconnected`` (the
worker reconnects).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from tradecore.orders import OrderError, RejectionCode

# The venue codes whose meaning the ccxt class does not carry (or carries too broadly).
VENUE_CODES: dict[str, dict[str, RejectionCode]] = {
    "binance": {
        "-2019": RejectionCode.INSUFFICIENT_MARGIN,  # Margin is insufficient.
        "-2018": RejectionCode.INSUFFICIENT_MARGIN,  # Balance is insufficient.
        "-1121": RejectionCode.INVALID_SYMBOL,  # Invalid symbol.
        "-4061": RejectionCode.POSITION_MODE_MISMATCH,  # position side vs. the user's setting
        "-1013": RejectionCode.INVALID_QUANTITY,  # filter failure (LOT_SIZE, NOTIONAL...)
        "-1111": RejectionCode.INVALID_QUANTITY,  # precision over the maximum
        "-4003": RejectionCode.INVALID_QUANTITY,  # quantity less than zero / below the minimum
        "-4164": RejectionCode.INVALID_QUANTITY,  # notional below the minimum
        "-1003": RejectionCode.BROKER_RATE_LIMITED,  # too many requests
        "-2022": RejectionCode.BROKER_REJECTED,  # ReduceOnly order is rejected
    },
    "bybit": {
        "110004": RejectionCode.INSUFFICIENT_MARGIN,  # wallet balance insufficient
        "110007": RejectionCode.INSUFFICIENT_MARGIN,  # available balance insufficient
        "110012": RejectionCode.INSUFFICIENT_MARGIN,  # insufficient available balance
        "110017": RejectionCode.BROKER_REJECTED,  # reduce-only order with nothing to reduce
        "110094": RejectionCode.INVALID_QUANTITY,  # order value below the lower limit
        "10006": RejectionCode.BROKER_RATE_LIMITED,  # too many visits
    },
}

MESSAGES: dict[RejectionCode, str] = {
    RejectionCode.INSUFFICIENT_MARGIN: "Insufficient margin at the broker",
    RejectionCode.INVALID_SYMBOL: "Symbol not found in the broker's contracts",
    RejectionCode.MARKET_CLOSED: "The market is closed",
    RejectionCode.POSITION_MODE_MISMATCH: (
        "The account is in hedge (two-way) position mode; switch it to one-way mode"
    ),
    RejectionCode.INVALID_QUANTITY: (
        "The broker refused the quantity (below its minimum, or not a multiple of its step)"
    ),
    RejectionCode.BROKER_REJECTED: "The broker rejected the order",
}
_POSITION_MODE = re.compile(r"position (side|idx) (does )?not match", re.IGNORECASE)
_DEFAULT_RETRY_AFTER_S = 1.0


def venue_detail(exc: BaseException) -> tuple[str | None, str]:
    """The venue's error code and message inside a library error's text (ccxt puts the
    venue's JSON body after the exchange id), else (None, the text)."""
    text = str(exc)
    start = text.find("{")
    if start >= 0:
        try:
            body: Any = json.loads(text[start:])
        except ValueError:
            body = None
        if isinstance(body, dict):
            code = body.get("code", body.get("retCode"))
            message = body.get("msg", body.get("retMsg", body.get("message")))
            if message is not None:
                return (None if code is None else str(code)), str(message)
    return None, text


def rejection(
    code: RejectionCode, broker_message: str | None, *, retry_after: float | None = None
) -> OrderError:
    """The ``OrderError`` for ``code`` with our words and the venue's."""
    if code is RejectionCode.BROKER_RATE_LIMITED:
        wait = retry_after if retry_after is not None else _DEFAULT_RETRY_AFTER_S
        message = f"The broker's rate limit was reached; retry after {wait:g} s"
        return OrderError(code, message, wait, broker_message)
    return OrderError(
        code, MESSAGES.get(code, MESSAGES[RejectionCode.BROKER_REJECTED]), None, broker_message
    )


def coded(family: str, venue_code: str | None, message: str) -> RejectionCode | None:
    """The rejection code the venue's own code (or message) names, if the table knows it."""
    if venue_code is not None and venue_code in VENUE_CODES.get(family, {}):
        return VENUE_CODES[family][venue_code]
    if _POSITION_MODE.search(message):
        return RejectionCode.POSITION_MODE_MISMATCH
    return None


def retry_after_s(headers: Any, now_s: float | None = None) -> float | None:
    """The seconds a venue's last answer asks to wait: its ``Retry-After``, or Bybit's
    ``X-Bapi-Limit-Reset-Timestamp`` (milliseconds since the epoch); None without either."""
    if not headers:
        return None
    lowered = {str(k).lower(): v for k, v in headers.items()}
    try:
        if lowered.get("retry-after") is not None:
            return max(0.0, float(lowered["retry-after"]))
        if lowered.get("x-bapi-limit-reset-timestamp") is not None:
            now = time.time() if now_s is None else now_s
            return max(0.0, float(lowered["x-bapi-limit-reset-timestamp"]) / 1000 - now)
    except (TypeError, ValueError):
        return None
    return None

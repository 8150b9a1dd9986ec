"""Symbols as users send them resolve to the venue's id (``tradecore.instruments``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tradecore.instruments import resolve_symbol
from tradecore.webhooks.payload import SYMBOL_PATTERN

NO_ALIASES: dict[str, str] = {}


@pytest.mark.parametrize(
    "sent",
    ["BTCUSDT", "btcusdt", " BTCUSDT ", "BINANCE:BTCUSDT", "BTCUSDT.P", "BYBIT:BTCUSDT.P",
     "BTC/USDT:USDT", "BTC/USDT", "btc/usdt:usdt"],
)  # fmt: skip
def test_every_form_of_one_instrument_is_its_venue_id(sent: str) -> None:
    assert resolve_symbol(sent, NO_ALIASES) == "BTCUSDT"


def test_an_account_alias_wins_with_or_without_the_exchange_prefix() -> None:
    aliases = {"ES1!": "ES", "BTCUSDT": "BTCUSDC"}
    assert resolve_symbol("ES1!", aliases) == "ES"
    assert resolve_symbol("CME_MINI:ES1!", aliases) == "ES"
    assert resolve_symbol("btcusdt", aliases) == "BTCUSDC"  # the map comes first


def test_symbols_the_rules_do_not_touch_stay_as_sent() -> None:
    assert resolve_symbol("AAPL", NO_ALIASES) == "AAPL"
    assert resolve_symbol("BRK.B", NO_ALIASES) == "BRK.B"
    assert resolve_symbol(".P", NO_ALIASES) == ".P"  # nothing left to name


@pytest.mark.parametrize(
    ("sent", "resolved"),
    [("BINANCE:BTC/USDT:USDT", "BTCUSDT"), ("BTC/USDT.P", "BTCUSDT"), ("X.P.P", "X"),
     ("A:B:ETHUSDT", "ETHUSDT"), ("BTC/USDT:", "BTCUSDT")],
)  # fmt: skip
def test_mixed_forms_resolve_fully(sent: str, resolved: str) -> None:
    assert resolve_symbol(sent, NO_ALIASES) == resolved


@settings(max_examples=500)
@given(st.from_regex(SYMBOL_PATTERN, fullmatch=True))
def test_resolving_twice_changes_nothing(sent: str) -> None:
    once = resolve_symbol(sent, NO_ALIASES)
    assert resolve_symbol(once, NO_ALIASES) == once

"""Symbols as users send them, resolved to the instrument id their venue uses.

Charting platforms and libraries name one instrument several ways: TradingView prefixes the
exchange (``BINANCE:BTCUSDT``) and marks perpetuals with ``.P`` (``BTCUSDT.P``), ccxt writes
``BTC/USDT:USDT`` for the linear perpetual and ``BTC/USDT`` for spot, and a futures chart says
``ES1!`` where the broker says ``ES``. Order history, ``allowed_symbols``, the replay
fingerprint and the broker all use one form: the venue's own id (``BTCUSDT``, ``AAPL``).

``resolve_symbol`` is pure and needs no market list, so the webhook path resolves a symbol
before its replay check without any I/O. An account's own ``symbol_map`` (alias -> venue id)
is applied first, both to the symbol as sent and to it without an exchange prefix, so a user
can name anything the textual rules do not cover.
"""

from __future__ import annotations

from collections.abc import Mapping

from tradecore.webhooks.canonical import canonical_symbol

PERPETUAL_SUFFIX = ".P"


def resolve_symbol(sent: str, symbol_map: Mapping[str, str]) -> str:
    """The venue id for ``sent`` (canonical: trimmed, upper case).

    1. the account's ``symbol_map`` (keys canonical), on the symbol as sent;
    2. exchange prefixes (``BINANCE:``; the part before a ``:`` that holds no ``/``) are
       dropped, and the map is tried again;
    3. a ccxt unified symbol ``BASE/QUOTE`` or ``BASE/QUOTE:SETTLE`` becomes ``BASEQUOTE``;
    4. TradingView's perpetual suffix ``.P`` is dropped.

    Without a map, resolving a resolved symbol changes nothing (it holds no ``:``, ``/`` or
    ``.P`` suffix any more).
    """
    symbol = canonical_symbol(sent)
    if symbol in symbol_map:
        return symbol_map[symbol]
    prefixed = False
    while ":" in symbol and "/" not in symbol.split(":", 1)[0]:
        symbol = symbol.split(":", 1)[1]
        prefixed = True
    if prefixed and symbol in symbol_map:
        return symbol_map[symbol]
    if "/" in symbol:
        symbol = symbol.split(":", 1)[0].replace("/", "")
    while symbol.endswith(PERPETUAL_SUFFIX) and len(symbol) > len(PERPETUAL_SUFFIX):
        symbol = symbol[: -len(PERPETUAL_SUFFIX)]
    return symbol

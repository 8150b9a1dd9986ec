"""The paper exchange's mutable state and its JSON-compatible form (decimals as strings,
enums as their values, script steps tagged with their kind)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import attrs
import cattrs
from cattrs.strategies import configure_tagged_union

from tradecore_adapters.brokers.book import Account
from tradecore_adapters.brokers.script import Fill, Reject, Step


@attrs.define
class ExchangeState:
    """Everything ``PaperExchange.snapshot`` saves. ``market_open`` holds per-symbol
    overrides of the trading hours; ``order_sequence`` numbers broker order ids."""

    prices: dict[str, Decimal]
    default_cash: Decimal
    accounts: dict[str, Account] = attrs.field(factory=dict)
    market_open: dict[str, bool] = attrs.field(factory=dict)
    script: list[Step] = attrs.field(factory=list)
    order_sequence: int = 0


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter()
    conv.register_unstructure_hook(Decimal, str)
    conv.register_structure_hook(Decimal, _structure_decimal)
    configure_tagged_union(Reject | Fill, conv, tag_name="kind")
    return conv


def _structure_decimal(value: Any, _: type) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(f"expected a decimal string, got {value!r}")
    return Decimal(value)


converter = _make_converter()

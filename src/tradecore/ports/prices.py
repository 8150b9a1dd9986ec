"""The price port: where the paper broker's instruments take their prices from.

A ``PriceSource`` answers the last price of a paper catalogue symbol (``BTCUSDT``, ``ES``, ...).
The paper broker asks it when a new order is placed and fills the order at that price; with no
source the paper exchange keeps the prices it has (the catalogue's reference prices, or those a
test sets).

The contract:

* **Freshness.** A price is the source's latest: a source that reads a venue may answer a price
  it read a short while ago (a cache of a few seconds, so a burst of orders costs one request),
  never one older than that while the venue answers.
* **No price.** None when the source has no price for the symbol: a symbol it does not quote
  (a venue without futures or equities), or a venue it has not reached yet.
* **Failures.** A source never raises because its venue is down, slow or answering nonsense:
  it logs a warning and answers the last price it had (however old), or None when it never had
  one. A price is a convenience of the simulation: a paper order must not fail, nor wait for a
  worker's reconnects, because a market-data feed is unreachable. The paper exchange, given
  None, keeps its own last known price for the symbol.
* A price answered is a finite number above zero.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Protocol, runtime_checkable


@runtime_checkable
class PriceSource(Protocol):
    """The prices paper orders fill at (see the module doc for the contract)."""

    async def price(self, symbol: str) -> Decimal | None:
        """The last price of ``symbol`` (a paper catalogue symbol), None when the source has
        none; never raises for the venue's failures."""
        ...

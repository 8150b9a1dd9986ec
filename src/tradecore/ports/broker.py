"""The broker port and the values it exchanges.

A broker order is identified by the caller's ``client_order_id``; placing an order with a
client order id the broker already knows returns that order instead of placing a new one. That
property is what lets a worker re-execute a request after a crash without doubling it.

Rejections (insufficient margin, market closed, ...) are results carried in ``BrokerOrder``,
never exceptions. A dropped connection, a timeout or an unreachable venue raises
``BrokerDisconnected``; credentials the venue refuses raise ``CredentialsRejected``.

A broker is opened for a ``BrokerAccount``: the trading account, its venue and, in clear, its
credentials. Only the worker process (and the API, to verify them) ever builds one; the
credentials never appear in a repr, a log line or an error message.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from decimal import Decimal
from typing import Protocol, runtime_checkable

import attrs

from tradecore.orders import OrderError, Side


class BrokerOrderStatus(enum.StrEnum):
    """The broker's view of one order."""

    PENDING = "pending"
    PARTIALLY_FILLED = "partially_filled"
    FILLED = "filled"
    CANCELLED = "cancelled"
    REJECTED = "rejected"

    @property
    def is_final(self) -> bool:
        return self in (
            BrokerOrderStatus.FILLED,
            BrokerOrderStatus.CANCELLED,
            BrokerOrderStatus.REJECTED,
        )


@attrs.frozen
class BrokerOrder:
    """One order as the broker reports it.

    ``rejection`` is set exactly when ``status`` is REJECTED (or CANCELLED with a reason).
    ``average_price`` is None until something filled.
    """

    broker_order_id: str
    client_order_id: str
    symbol: str
    side: Side
    quantity: Decimal
    status: BrokerOrderStatus
    filled_quantity: Decimal = Decimal(0)
    average_price: Decimal | None = None
    reduce_only: bool = False
    rejection: OrderError | None = None

    @classmethod
    def refused(
        cls,
        client_order_id: str,
        symbol: str,
        side: Side,
        quantity: Decimal,
        error: OrderError,
        *,
        reduce_only: bool = False,
    ) -> BrokerOrder:
        """An order the broker (or its adapter, before sending) refused: nothing was placed,
        so it has no broker id."""
        return cls(
            broker_order_id="",
            client_order_id=client_order_id,
            symbol=symbol,
            side=side,
            quantity=quantity,
            status=BrokerOrderStatus.REJECTED,
            reduce_only=reduce_only,
            rejection=error,
        )


@attrs.frozen
class BrokerAccount:
    """What a broker connection is opened for.

    ``broker_name`` is the venue (``paper``, a ccxt exchange id such as ``binanceusdm``, or
    ``alpaca``); ``testnet`` selects the venue's test or paper environment. ``credentials``
    are the decrypted fields the user uploaded (empty for the paper broker);
    ``credentials_ref`` names that version of them (a digest of the stored ciphertext, empty
    when none are stored), so a worker can tell a rotated credential from the one its open
    connection uses without decrypting anything.
    """

    trading_account_id: str
    broker_name: str
    testnet: bool = False
    credentials: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    credentials_ref: str = ""


@runtime_checkable
class Broker(Protocol):
    """A connection to one trading account at one broker, owned by one worker.

    Every method may raise ``BrokerDisconnected``; ``connect`` re-establishes the connection
    and is safe to call when already connected.
    """

    @property
    def name(self) -> str:
        """The broker's name as stored in order history (``broker_name``)."""
        ...

    @property
    def placements_wait_for_outcome(self) -> bool:
        """True when nothing this broker places is kept until the order's outcome is written
        (the paper broker in real mode: its book commits with the outcome,
        ``SavesWithOrder``), and a placement whose outcome does not take is dropped, the
        broker going back to its stored state. The worker then places a one-step order
        without claiming it first: the outcome's compare-and-set from ``queued`` is the
        claim (``order_lifecycle.ClaimedAndExecuted``). False for a venue, where a placement
        is real the moment it is sent."""
        ...

    async def connect(self) -> None:
        """Open (or re-open) the connection and check the credentials."""
        ...

    async def instruments(self) -> frozenset[str]:
        """The symbols this account can trade."""
        ...

    async def positions(self) -> Mapping[str, Decimal]:
        """Signed positions by symbol (positive long, negative short); flat symbols omitted."""
        ...

    async def place_order(
        self,
        client_order_id: str,
        symbol: str,
        side: Side,
        quantity: Decimal,
        *,
        reduce_only: bool = False,
        fresh: bool = False,
    ) -> BrokerOrder:
        """Submit a market order; idempotent by ``client_order_id``.

        A second call with a known ``client_order_id`` returns the existing order unchanged.
        A ``reduce_only`` order never increases the absolute position.

        ``fresh`` is a hint: True is the caller's guarantee that no order was placed under
        ``client_order_id`` before, by any process through any connection (only refusals
        that recorded nothing, such as a rate limit, may have preceded this call). A broker
        may then skip looking for an earlier placement it cannot see locally (the paper
        broker skips reading its stored orders); it never changes the result, and a broker
        that deduplicates on its side ignores it. A caller that cannot rule out an earlier
        attempt (a recovered order, a retry after a disconnect) passes False.
        """
        ...

    async def order_status(self, client_order_id: str, symbol: str) -> BrokerOrder | None:
        """The current state of the order placed under ``client_order_id`` on ``symbol`` (a
        venue may need the symbol to find it), None if the broker never saw it."""
        ...

    async def close(self) -> None:
        """Release what the connection holds (sessions, sockets, threads). Safe to call more
        than once; the broker is not used after it."""
        ...


@runtime_checkable
class BrokerFactory(Protocol):
    """Opens the broker connection a worker uses for one trading account."""

    def open(self, account: BrokerAccount, *, simulation: bool) -> Broker:
        """A broker for ``account``, not yet connected. ``simulation`` always yields the paper
        broker. Raises ``ValueError`` for a venue this factory does not know."""
        ...

    def venues(self) -> frozenset[str]:
        """The broker names ``open`` accepts for real orders."""
        ...


@runtime_checkable
class BrokerAccountSource(Protocol):
    """The broker account of a trading account, credentials decrypted (the worker's view)."""

    async def broker_account(self, trading_account_id: str) -> BrokerAccount | None:
        """The account's venue and credentials as stored now; None for an unknown or deleted
        account. Raises ``StoreUnavailable`` when the store cannot be reached and
        ``DecryptionFailed`` when the stored credentials do not open."""
        ...


@runtime_checkable
class InstrumentDirectory(Protocol):
    """The instruments each venue lists, for the API's order checks and the dashboard's order
    form; never through a user's broker connection (a venue's market list is public)."""

    def venues(self) -> frozenset[str]:
        """The broker names an account may name (no I/O)."""
        ...

    async def symbols(self, broker_name: str, *, testnet: bool = False) -> frozenset[str]:
        """The venue's instrument ids (``BTCUSDT``, ``AAPL``), empty for an unknown venue.
        Loaded once and kept for a while; raises ``BrokerDisconnected`` when the venue's list
        cannot be loaded."""
        ...

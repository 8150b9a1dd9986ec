"""The paper broker's instrument catalogue: what can be traded, at what size, margin and hours.

Trading hours are weekly sessions in the market's own time zone (``zoneinfo``, so daylight
saving follows the exchange). Exchange holidays are not modelled.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from datetime import datetime, time
from decimal import Decimal
from zoneinfo import ZoneInfo

import attrs

_DAY_S = 86_400
MONDAY, TUESDAY, WEDNESDAY, THURSDAY, FRIDAY, SATURDAY, SUNDAY = range(7)


class InstrumentKind(enum.StrEnum):
    FUTURE = "future"
    CRYPTO_PERP = "crypto_perp"
    FX = "fx"
    EQUITY = "equity"


class PositionMode(enum.StrEnum):
    """How the account holds positions on the instrument. Only ONE_WAY can be traded here:
    one signed position per symbol (HEDGE keeps separate long and short legs)."""

    ONE_WAY = "one_way"
    HEDGE = "hedge"


def weekly_second(weekday: int, at: time) -> int:
    """Seconds since Monday 00:00 of ``weekday`` (Monday = 0) at ``at``."""
    return weekday * _DAY_S + at.hour * 3600 + at.minute * 60 + at.second


@attrs.frozen
class TradingHours:
    """Weekly sessions ``[start, end)`` in seconds since Monday 00:00 local time of ``zone``.

    A session whose end is not after its start wraps over the week's end (Sunday evening to
    Friday, say). ``zone`` None with no sessions means the market never closes.
    """

    text: str
    zone: str | None = None
    sessions: tuple[tuple[int, int], ...] = ()

    @classmethod
    def always(cls) -> TradingHours:
        return cls("24/7")

    @classmethod
    def weekly(
        cls, text: str, zone: str, sessions: Iterable[tuple[int, time, int, time]]
    ) -> TradingHours:
        """Sessions given as (open weekday, open time, close weekday, close time)."""
        return cls(
            text,
            zone,
            tuple((weekly_second(d1, t1), weekly_second(d2, t2)) for d1, t1, d2, t2 in sessions),
        )

    def is_open(self, when: datetime) -> bool:
        """Whether the market trades at ``when`` (timezone-aware)."""
        if self.zone is None:
            return True
        local = when.astimezone(ZoneInfo(self.zone))
        second = weekly_second(local.weekday(), local.time())
        for start, end in self.sessions:
            if start < end and start <= second < end:
                return True
            if start >= end and (second >= start or second < end):
                return True
        return False


def _daily_sessions(
    days: Iterable[int], opens: time, closes: time
) -> list[tuple[int, time, int, time]]:
    return [(d, opens, d, closes) for d in days]


def _overnight_sessions(
    first: int, last: int, opens: time, closes: time
) -> list[tuple[int, time, int, time]]:
    """Sessions opening on ``first``..``last`` at ``opens`` (counting on from Sunday) and
    closing the next day at ``closes``."""
    days = [SUNDAY, MONDAY, TUESDAY, WEDNESDAY, THURSDAY, FRIDAY, SATURDAY]
    span = days[days.index(first) : days.index(last) + 1]
    return [(d, opens, (d + 1) % 7, closes) for d in span]


CRYPTO_HOURS = TradingHours.always()
CME_HOURS = TradingHours.weekly(
    "Sunday 17:00 to Friday 16:00 America/Chicago, with a daily break 16:00-17:00",
    "America/Chicago",
    _overnight_sessions(SUNDAY, THURSDAY, time(17), time(16)),
)
FX_HOURS = TradingHours.weekly(
    "Sunday 17:00 to Friday 17:00 America/New_York",
    "America/New_York",
    [(SUNDAY, time(17), FRIDAY, time(17))],
)
US_EQUITY_HOURS = TradingHours.weekly(
    "Monday to Friday 09:30-16:00 America/New_York",
    "America/New_York",
    _daily_sessions(range(MONDAY, SATURDAY), time(9, 30), time(16)),
)


@attrs.frozen
class Instrument:
    """One tradable symbol.

    Margin needed to open ``q`` is ``q * contract_size * price * margin_rate``.
    """

    symbol: str
    kind: InstrumentKind
    contract_size: Decimal
    reference_price: Decimal
    margin_rate: Decimal
    hours: TradingHours
    position_mode: PositionMode = PositionMode.ONE_WAY

    def margin(self, quantity: Decimal, price: Decimal) -> Decimal:
        return quantity * self.contract_size * price * self.margin_rate


DEFAULT_INSTRUMENTS: tuple[Instrument, ...] = (
    Instrument(
        "BTCUSDT", InstrumentKind.CRYPTO_PERP, Decimal(1), Decimal(60000), Decimal("0.1"),
        CRYPTO_HOURS,
    ),
    Instrument(
        "ETHUSDT", InstrumentKind.CRYPTO_PERP, Decimal(1), Decimal(3000), Decimal("0.1"),
        CRYPTO_HOURS, PositionMode.HEDGE,
    ),
    Instrument(
        "ES", InstrumentKind.FUTURE, Decimal(50), Decimal(6000), Decimal("0.05"), CME_HOURS
    ),
    Instrument(
        "MES", InstrumentKind.FUTURE, Decimal(5), Decimal(6000), Decimal("0.05"), CME_HOURS
    ),
    Instrument(
        "EURUSD", InstrumentKind.FX, Decimal(100000), Decimal("1.08"), Decimal("0.02"), FX_HOURS
    ),
    Instrument(
        "AAPL", InstrumentKind.EQUITY, Decimal(1), Decimal(230), Decimal("0.5"), US_EQUITY_HOURS
    ),
)  # fmt: skip


def default_catalogue() -> Mapping[str, Instrument]:
    """The catalogue every paper account trades: BTCUSDT, ETHUSDT, ES, MES, EURUSD, AAPL."""
    return {instrument.symbol: instrument for instrument in DEFAULT_INSTRUMENTS}

"""The dashboard's pictures, drawn on the server as SVG: no chart library, no script.

Pure functions: order-history rows in, a small model and an SVG string out (``markupsafe``
``Markup``, so the templates insert it as is). Every text that reaches the markup goes
through ``html.escape``; every chart carries ``role="img"``, an ``aria-label`` and a
``<title>``, and the page prints its summary and a data table beside it. Colours and sizes
are SVG presentation attributes (``fill``, ``stroke``, ``width``), never a ``style``
attribute, so the pictures live under the service's Content-Security-Policy.

**Position over time per symbol** (``position_series``). The history holds no position
snapshots, so the position is rebuilt from the account's real (non-simulation) orders,
oldest first by the time the worker claimed them (``submitted_at``, else ``created_at``):

* ``position_before`` is the signed position the worker read from the broker when it claimed
  the order; where it is recorded it is taken as the truth at that moment (a difference from
  the running position means the position changed outside these orders, e.g. by a trade on
  the venue itself, and shows as a step).
* The order's effect is signed by its side: ``buy`` entries and exits and ``close_short`` add,
  ``sell`` entries and exits and ``close_long`` subtract. An entry moves the position by
  ``exit_quantity`` (the automatic close of an opposite position, ``auto_exit``) plus
  ``fill_quantity``; an exit or a close by ``fill_quantity``. So ``buy 1`` from flat gives
  ``+1``; ``sell 2`` from ``+1`` closes 1 (``exit_quantity``) and sells 2 (``fill_quantity``):
  ``+1 - 1 - 2 = -2``. A refused order moves it by what it filled (an entry whose close
  filled but whose entry was refused moved it by the close).
* Where ``position_before`` is missing (the worker has not read it yet) the running position
  (0 at the start) stands in for it. The step is drawn at ``filled_at``, else ``submitted_at``,
  else ``created_at``.

**Orders per day** (``orders_per_day``): every order of the account created on each of the
last ``days`` UTC days (simulations included), by outcome: filled (``filled``,
``partially_filled``), refused or failed (``rejected``, ``failed``), other (every other status:
queued, in flight, cancelled, expired, ``no_position``).

**Stages of one order** (``order_stages``), from the moments the record holds:
``created_at`` (the request arrived), ``admitted_at`` (its checks passed and the intent was
written), ``submitted_at`` (a worker claimed it), ``placed_at`` (the broker answered the
placement) and ``filled_at`` (the fill was recorded). "Received" is the time from arrival to
admission (parsing, the four webhook layers, the order checks), "admitted" the moment of
admission, "queued" the time until a worker claimed it (the durable write, the hand-over, the
wait for the worker), "executing" the time until the broker answered, "placed" the time until
the fill was recorded (none for a market order the broker filled at once), "filled" the
moment of the fill. Orders stored before ``admitted_at`` and ``placed_at`` existed say "not
recorded" for the spans that need them, never a made-up number.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from html import escape

import attrs
from markupsafe import Markup

from tradecore.orders import AlertAction, OrderHistoryRecord, OrderStatus, OrderType
from tradecore_adapters.http.views import decimal

ZERO = Decimal(0)
PALETTE = ("#1f5fbf", "#c2410c", "#1c7c3c", "#7c3aed", "#b3261e", "#0e7490", "#a16207")
WIDTH = 640
_FONT = 'font-family="system-ui, sans-serif" font-size="11"'


def utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _t(text: object) -> str:
    return escape(str(text), quote=True)


def _n(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


# --- position over time -------------------------------------------------------------------


@attrs.frozen
class PositionPoint:
    """From ``at`` on, the position is ``position`` (after order ``order_id``)."""

    at: datetime
    position: Decimal
    order_id: str


@attrs.frozen
class PositionSeries:
    symbol: str
    points: tuple[PositionPoint, ...]

    @property
    def current(self) -> Decimal:
        return self.points[-1].position

    @property
    def summary(self) -> str:
        return f"{self.symbol}: {decimal(self.current)} now"


def order_effect(row: OrderHistoryRecord) -> Decimal:
    """How much the order moved the signed position (see the module docstring)."""
    buys = row.action in (AlertAction.BUY, AlertAction.CLOSE_SHORT)
    sign = 1 if buys else -1
    moved = row.fill_quantity
    is_entry = row.action in (AlertAction.BUY, AlertAction.SELL)
    if is_entry and row.order_type is OrderType.ENTRY:
        moved += row.exit_quantity
    return sign * moved


def _claim_order(row: OrderHistoryRecord) -> tuple[datetime, datetime, str]:
    return (utc(row.submitted_at or row.created_at), utc(row.created_at), row.id)


def _step_time(row: OrderHistoryRecord) -> datetime:
    return utc(row.filled_at or row.submitted_at or row.created_at)


def position_series(rows: Iterable[OrderHistoryRecord]) -> list[PositionSeries]:
    """The position per symbol after each real order that read or moved it, by symbol."""
    running: dict[str, Decimal] = {}
    points: dict[str, list[PositionPoint]] = {}
    for row in sorted((r for r in rows if not r.simulation), key=_claim_order):
        effect = order_effect(row)
        if effect == ZERO and row.position_before is None:
            continue
        before = running.get(row.symbol, ZERO)
        if row.position_before is not None:
            before = row.position_before
        series = points.setdefault(row.symbol, [])
        at = _step_time(row)
        if not series or series[-1].position != before:
            series.append(PositionPoint(utc(row.submitted_at or row.created_at), before, ""))
        running[row.symbol] = before + effect
        series.append(PositionPoint(at, before + effect, row.id))
    return [PositionSeries(symbol, tuple(points[symbol])) for symbol in sorted(points)]


def _scale(lo: float, hi: float, top: float, bottom: float) -> tuple[float, float]:
    """(factor, offset) mapping the value range onto the pixel range (top is the high end)."""
    span = (hi - lo) or 1.0
    factor = (bottom - top) / span
    return factor, top + hi * factor


def position_svg(series: Sequence[PositionSeries], now: datetime) -> Markup:
    """Step lines of the position per symbol, from the first order to ``now``."""
    title = "Position over time per symbol: " + "; ".join(s.summary for s in series)
    height, left, right, top, bottom = 220 + 16 * ((len(series) + 2) // 3), 56, WIDTH - 20, 14, 180
    times = [p.at for s in series for p in s.points]
    start = min(times) if times else utc(now)
    end = max([*times, utc(now)])
    seconds = (end - start).total_seconds() or 1.0
    values = [float(p.position) for s in series for p in s.points] + [0.0]
    lo, hi = min(values), max(values)
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    factor, offset = _scale(lo, hi, top, bottom)

    def x(at: datetime) -> float:
        return left + (right - left) * (at - start).total_seconds() / seconds

    def y(value: Decimal | float) -> float:
        return offset - float(value) * factor

    parts = [_open(height, title)]
    parts.append(_line(left, y(0), right, y(0), "#5b6475", dash=True))
    parts.append(_line(left, top, left, bottom, "#dde1e8"))
    for value in sorted({lo, hi, 0.0}):
        parts.append(_text(left - 6, y(value) + 4, _n(value), anchor="end"))
    parts.append(_text(left, bottom + 16, start.strftime("%Y-%m-%d %H:%M"), anchor="start"))
    parts.append(_text(right, bottom + 16, end.strftime("%Y-%m-%d %H:%M UTC"), anchor="end"))
    for index, one in enumerate(series):
        colour = PALETTE[index % len(PALETTE)]
        path = f"M{_n(x(one.points[0].at))} {_n(y(one.points[0].position))}"
        for point in one.points[1:]:
            path += f" H{_n(x(point.at))} V{_n(y(point.position))}"
        path += f" H{_n(right)}"
        parts.append(
            f'<path class="series" d="{path}" fill="none" stroke="{colour}" stroke-width="2">'
            f"<title>{_t(one.summary)}</title></path>"
        )
        label_x, label_y = left + 190 * (index % 3), bottom + 40 + 16 * (index // 3)
        parts.append(_line(label_x, label_y - 4, label_x + 14, label_y - 4, colour, width=3))
        parts.append(_text(label_x + 18, label_y, one.summary, anchor="start"))
    if not series:
        parts.append(_text(WIDTH / 2, height / 2, "No position yet", anchor="middle"))
    return _close(parts)


# --- orders per day -----------------------------------------------------------------------


class Outcome(enum.StrEnum):
    FILLED = "filled"
    REFUSED = "rejected or failed"
    OTHER = "other"


OUTCOME_COLOURS = {Outcome.FILLED: "#1c7c3c", Outcome.REFUSED: "#b3261e", Outcome.OTHER: "#9aa3b2"}


def outcome(status: OrderStatus) -> Outcome:
    if status in (OrderStatus.FILLED, OrderStatus.PARTIALLY_FILLED):
        return Outcome.FILLED
    if status in (OrderStatus.REJECTED, OrderStatus.FAILED):
        return Outcome.REFUSED
    return Outcome.OTHER


@attrs.frozen
class DayCount:
    day: date
    filled: int = 0
    refused: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return self.filled + self.refused + self.other

    def count(self, kind: Outcome) -> int:
        return {Outcome.FILLED: self.filled, Outcome.REFUSED: self.refused}.get(kind, self.other)


def orders_per_day(
    rows: Iterable[OrderHistoryRecord], today: date, days: int = 30
) -> list[DayCount]:
    """One count per UTC day, the oldest first, ending with ``today``."""
    first = today - timedelta(days=days - 1)
    tally: dict[date, dict[Outcome, int]] = {}
    for row in rows:
        day = utc(row.created_at).date()
        if first <= day <= today:
            kinds = tally.setdefault(day, dict.fromkeys(Outcome, 0))
            kinds[outcome(row.status)] += 1
    counts = []
    for offset in range(days):
        day = first + timedelta(days=offset)
        kinds = tally.get(day, dict.fromkeys(Outcome, 0))
        counts.append(
            DayCount(day, kinds[Outcome.FILLED], kinds[Outcome.REFUSED], kinds[Outcome.OTHER])
        )
    return counts


def orders_summary(counts: Sequence[DayCount]) -> str:
    filled = sum(c.filled for c in counts)
    refused = sum(c.refused for c in counts)
    other = sum(c.other for c in counts)
    total = filled + refused + other
    return (
        f"{total} orders in the last {len(counts)} days: {filled} filled, "
        f"{refused} rejected or failed, {other} other"
    )


def orders_per_day_svg(counts: Sequence[DayCount]) -> Markup:
    """Stacked bars: per day, filled at the bottom, then refused, then the rest."""
    height, left, top, bottom = 220, 40, 14, 170
    slot = (WIDTH - left - 10) / max(len(counts), 1)
    most = max([c.total for c in counts] + [1])
    parts = [_open(height, "Orders per day by outcome: " + orders_summary(counts))]
    parts.append(_line(left, bottom, WIDTH - 10, bottom, "#5b6475"))
    parts.append(_text(left - 6, top + 4, str(most), anchor="end"))
    parts.append(_text(left - 6, bottom + 4, "0", anchor="end"))
    for index, day in enumerate(counts):
        x = left + index * slot + 2
        base = float(bottom)
        for kind in Outcome:
            number = day.count(kind)
            if not number:
                continue
            tall = (bottom - top) * number / most
            base -= tall
            label = f"{day.day.isoformat()}: {number} {kind.value}"
            parts.append(
                f'<rect class="bar" data-day="{day.day.isoformat()}" x="{_n(x)}" y="{_n(base)}" '
                f'width="{_n(slot - 4)}" height="{_n(tall)}" fill="{OUTCOME_COLOURS[kind]}">'
                f"<title>{_t(label)}</title></rect>"
            )
    if counts:
        parts.append(_text(left, bottom + 16, counts[0].day.isoformat(), anchor="start"))
        last_x = left + len(counts) * slot
        parts.append(_text(last_x, bottom + 16, counts[-1].day.isoformat(), anchor="end"))
    for kind, legend_x in zip(Outcome, (left + 160.0, left + 240.0, left + 380.0), strict=True):
        parts.append(
            f'<rect x="{_n(legend_x)}" y="{bottom + 22}" width="10" height="10" '
            f'fill="{OUTCOME_COLOURS[kind]}"></rect>'
        )
        parts.append(_text(legend_x + 14, bottom + 31, kind.value, anchor="start"))
    return _close(parts)


# --- stages of one order --------------------------------------------------------------------


@attrs.frozen
class Stage:
    """One stage of an order's life: measured when both ends are recorded."""

    name: str
    start: datetime | None
    end: datetime | None
    note: str
    moment: bool = False
    """A point in time (the fill), not a span."""

    @property
    def seconds(self) -> float | None:
        if self.moment or self.start is None or self.end is None:
            return None
        return max((utc(self.end) - utc(self.start)).total_seconds(), 0.0)

    @property
    def words(self) -> str:
        if self.moment and self.start is not None:
            return f"{self.name} at {utc(self.start).strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]} UTC"
        if self.seconds is not None:
            return f"{self.name}: {_duration(self.seconds)}"
        return f"{self.name}: {self.note}"


def _duration(seconds: float) -> str:
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.1f} min"


NOT_RECORDED = "not recorded"


def order_stages(row: OrderHistoryRecord) -> tuple[Stage, ...]:
    """The stages received, admitted, queued, executing, placed and filled (see the module
    docstring for what each measures); a stage not reached yet says so."""
    settled = row.status.is_terminal
    admitted = row.admitted_at
    queued_end = row.submitted_at
    if queued_end is None:
        queued_note = "still queued" if row.status is OrderStatus.QUEUED else "not reached"
    else:
        queued_note = NOT_RECORDED if admitted is None else ""
    was_placed = bool(row.broker_refs) or row.filled_at is not None
    if row.submitted_at is None:
        executing_note = "not reached"
    elif row.placed_at is not None:
        executing_note = ""
    elif was_placed:
        executing_note = NOT_RECORDED  # placed before placement times were recorded
    else:
        executing_note = "ended unplaced" if settled else "not over"
    if row.placed_at is None:
        placed_note = NOT_RECORDED if was_placed else "not reached"
    elif row.filled_at is None:
        placed_note = "ended without a fill" if settled else "waiting for the fill"
    else:
        placed_note = ""
    return (
        Stage("received", row.created_at, admitted, NOT_RECORDED if admitted is None else ""),
        Stage("admitted", admitted, admitted, NOT_RECORDED, moment=True),
        Stage("queued", admitted, queued_end, queued_note),
        Stage("executing", row.submitted_at, row.placed_at, executing_note),
        Stage("placed", row.placed_at, row.filled_at, placed_note),
        Stage("filled", row.filled_at, row.filled_at, "not filled", moment=True),
    )


STAGE_COLOURS = ("#1f5fbf", "#c2410c", "#1c7c3c")
_LABEL_PX_PER_CHAR = 6.5  # an 11 px sans-serif label's width per character, with a margin


def stages_summary(stages: Sequence[Stage]) -> str:
    return "; ".join(s.words for s in stages)


def stages_svg(stages: Sequence[Stage]) -> Markup:
    """One horizontal bar: the measured spans side by side, their length to scale."""
    measured = [s for s in stages if s.seconds is not None]
    total = sum(s.seconds or 0.0 for s in measured)
    height, left, right = 70, 10, WIDTH - 10
    parts = [_open(height, "Time in each stage: " + stages_summary(stages))]
    x = float(left)
    for index, stage in enumerate(measured):
        share = (stage.seconds or 0.0) / total if total else 1 / len(measured)
        wide = max((right - left) * share, 2.0)
        parts.append(
            f'<rect class="stage" data-stage="{_t(stage.name)}" x="{_n(x)}" y="10" '
            f'width="{_n(wide)}" height="24" fill="{STAGE_COLOURS[index % 3]}">'
            f"<title>{_t(stage.words)}</title></rect>"
        )
        if wide >= _LABEL_PX_PER_CHAR * len(stage.words):  # else its title and the list say it
            parts.append(_text(x + 2, 50, stage.words, anchor="start"))
        x += wide
    if not measured:
        parts.append(_text(WIDTH / 2, 30, "No stage measured yet", anchor="middle"))
    return _close(parts)


# --- SVG pieces ---------------------------------------------------------------------------


def _open(height: int, title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
        f'aria-label="{_t(title)}"><title>{_t(title)}</title>'
    )


def _close(parts: list[str]) -> Markup:
    """The finished SVG. Every text in ``parts`` went through ``_t`` (``html.escape``) and
    every number through ``_n``, so the markup is safe to insert as is."""
    return Markup("".join([*parts, "</svg>"]))  # noqa: S704 (texts escaped by _t)


def _line(
    x1: float, y1: float, x2: float, y2: float, colour: str, *, dash: bool = False, width: int = 1
) -> str:
    dashed = ' stroke-dasharray="4 3"' if dash else ""
    return (
        f'<line x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}" '
        f'stroke="{colour}" stroke-width="{width}"{dashed}></line>'
    )


def _text(x: float, y: float, words: str, *, anchor: str) -> str:
    return (
        f'<text x="{_n(x)}" y="{_n(y)}" text-anchor="{anchor}" fill="#1d2330" {_FONT}>'
        f"{_t(words)}</text>"
    )

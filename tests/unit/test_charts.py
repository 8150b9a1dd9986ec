"""The dashboard's server-rendered charts (``tradecore_adapters.http.charts``): the position
rebuilt from the history, the orders per day, the stages of one order, and SVG that parses as
XML, carries no ``style`` attribute and escapes its text."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import attrs

from tradecore.orders import AlertAction, OrderHistoryRecord, OrderStatus, OrderType, Source
from tradecore_adapters.http import charts

T0 = datetime(2026, 1, 5, 14, 30, tzinfo=UTC)
SVG = "{http://www.w3.org/2000/svg}"


def _row(number: int, action: AlertAction, quantity: str, **fields: Any) -> OrderHistoryRecord:
    at = T0 + timedelta(minutes=number)
    defaults: dict[str, Any] = {
        "id": f"o{number}",
        "user_id": "u1",
        "trading_account_id": "a1",
        "broker_name": "paper",
        "symbol": "BTCUSDT",
        "action": action,
        "quantity": Decimal(quantity),
        "order_type": OrderType.ENTRY,
        "source": Source.WEBHOOK,
        "simulation": False,
        "status": OrderStatus.FILLED,
        "created_at": at,
        "request_id": f"r{number}",
        "submitted_at": at + timedelta(milliseconds=20),
        "filled_at": at + timedelta(milliseconds=70),
        "fill_price": Decimal(60000),
        "fill_quantity": Decimal(quantity),
    }
    return OrderHistoryRecord(**(defaults | fields))


def _reversal() -> list[OrderHistoryRecord]:
    return [
        _row(1, AlertAction.BUY, "1", position_before=Decimal(0)),
        _row(
            2,
            AlertAction.SELL,
            "2",
            position_before=Decimal(1),
            auto_exit=True,
            exit_quantity=Decimal(1),
        ),
        _row(3, AlertAction.CLOSE_SHORT, "2", position_before=Decimal(-2)),
    ]


def _svg_tree(markup: str) -> ET.Element:
    root = ET.fromstring(markup)
    assert root.tag == f"{SVG}svg"
    for element in root.iter():
        assert "style" not in element.attrib, element.tag
        assert element.tag != f"{SVG}style"
    assert root.get("role") == "img"
    assert root.get("aria-label")
    assert root.find(f"{SVG}title") is not None
    return root


def test_a_reversal_rebuilds_the_positions() -> None:
    [series] = charts.position_series(reversed(_reversal()))  # the history is newest first
    assert [p.position for p in series.points] == [0, 1, -2, 0]
    assert [p.order_id for p in series.points] == ["", "o1", "o2", "o3"]
    assert series.summary == "BTCUSDT: 0 now"


def test_the_running_position_stands_in_for_an_unread_one_and_simulations_are_left_out() -> None:
    rows = [
        _row(1, AlertAction.BUY, "1"),
        _row(2, AlertAction.SELL, "2", auto_exit=True, exit_quantity=Decimal(1)),
        _row(3, AlertAction.BUY, "5", simulation=True, position_before=Decimal(7)),
        _row(4, AlertAction.BUY, "1", symbol="ETHUSDT", order_type=OrderType.EXIT),
    ]
    btc, eth = charts.position_series(rows)
    assert [p.position for p in btc.points] == [0, 1, -2]
    assert btc.summary == "BTCUSDT: -2 now"
    assert eth.summary == "ETHUSDT: 1 now"


def test_a_position_changed_outside_the_orders_shows_as_a_step() -> None:
    rows = [
        _row(1, AlertAction.BUY, "1", position_before=Decimal(0)),
        _row(2, AlertAction.SELL, "1", order_type=OrderType.EXIT, position_before=Decimal(3)),
    ]
    [series] = charts.position_series(rows)
    assert [p.position for p in series.points] == [0, 1, 3, 2]


def test_a_refused_entry_moves_the_position_by_its_close_only() -> None:
    refused = _row(
        1,
        AlertAction.BUY,
        "1",
        status=OrderStatus.REJECTED,
        fill_quantity=Decimal(0),
        fill_price=None,
        filled_at=None,
        position_before=Decimal(-3),
        auto_exit=True,
        exit_quantity=Decimal(3),
    )
    assert charts.order_effect(refused) == Decimal(3)
    [series] = charts.position_series([refused])
    assert series.current == 0


def test_bars_count_the_orders_of_each_day_by_outcome() -> None:
    today = date(2026, 1, 10)
    rows = [
        _row(1, AlertAction.BUY, "1"),  # 2026-01-05
        _row(2, AlertAction.BUY, "1", status=OrderStatus.REJECTED),
        _row(3, AlertAction.BUY, "1", status=OrderStatus.QUEUED),
        _row(4, AlertAction.BUY, "1", created_at=datetime(2026, 1, 10, 23, 59, tzinfo=UTC)),
        _row(5, AlertAction.BUY, "1", status=OrderStatus.FAILED, created_at=T0.replace(day=9)),
        _row(6, AlertAction.BUY, "1", created_at=T0 - timedelta(days=40)),  # too old
    ]
    counts = charts.orders_per_day(rows, today, days=30)
    assert len(counts) == 30
    assert counts[0].day == date(2025, 12, 12)
    assert counts[-1].day == today
    by_day = {c.day: (c.filled, c.refused, c.other) for c in counts if c.total}
    assert by_day == {
        date(2026, 1, 5): (1, 1, 1),
        date(2026, 1, 9): (0, 1, 0),
        date(2026, 1, 10): (1, 0, 0),
    }
    summary = charts.orders_summary(counts)
    assert summary == "5 orders in the last 30 days: 2 filled, 2 rejected or failed, 1 other"
    root = _svg_tree(charts.orders_per_day_svg(counts))
    bars = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "bar"]
    assert sorted(b.findtext(f"{SVG}title") or "" for b in bars) == [
        "2026-01-05: 1 filled",
        "2026-01-05: 1 other",
        "2026-01-05: 1 rejected or failed",
        "2026-01-09: 1 rejected or failed",
        "2026-01-10: 1 filled",
    ]


def test_every_stage_is_measured_from_the_recorded_moments() -> None:
    at = T0 + timedelta(minutes=1)
    row = _row(
        1,
        AlertAction.BUY,
        "1",
        admitted_at=at + timedelta(milliseconds=3),
        placed_at=at + timedelta(milliseconds=60),
        filled_at=at + timedelta(milliseconds=900),
    )
    words = [s.words for s in charts.order_stages(row)]
    assert words == [
        "received: 3.0 ms",
        "admitted at 2026-01-05 14:31:00.003 UTC",
        "queued: 17 ms",
        "executing: 40 ms",
        "placed: 840 ms",
        "filled at 2026-01-05 14:31:00.900 UTC",
    ]
    root = _svg_tree(charts.stages_svg(charts.order_stages(row)))
    spans = [r.get("data-stage") for r in root.iter(f"{SVG}rect")]
    assert spans == ["received", "queued", "executing", "placed"]


def test_an_order_stored_before_the_moments_were_recorded_says_so() -> None:
    row = _row(1, AlertAction.BUY, "1")  # no admitted_at, no placed_at
    words = [s.words for s in charts.order_stages(row)]
    assert words == [
        "received: not recorded",
        "admitted: not recorded",
        "queued: not recorded",
        "executing: not recorded",
        "placed: not recorded",
        "filled at 2026-01-05 14:31:00.070 UTC",
    ]


def test_a_queued_order_has_no_number_beyond_what_is_recorded() -> None:
    at = T0 + timedelta(minutes=1)
    row = _row(
        1,
        AlertAction.BUY,
        "1",
        status=OrderStatus.QUEUED,
        admitted_at=at + timedelta(milliseconds=2),
        submitted_at=None,
        filled_at=None,
        fill_price=None,
        fill_quantity=Decimal(0),
    )
    stages = charts.order_stages(row)
    assert [s.seconds for s in stages] == [0.002, None, None, None, None, None]
    assert [s.words for s in stages][2:] == [
        "queued: still queued",
        "executing: not reached",
        "placed: not reached",
        "filled: not filled",
    ]


def test_the_position_svg_is_well_formed_and_escapes_its_text() -> None:
    hostile = [attrs.evolve(r, symbol='<B&"X>') for r in _reversal()]
    series = charts.position_series(hostile)
    markup = str(charts.position_svg(series, T0 + timedelta(hours=1)))
    assert '<B&"X>' not in markup
    root = _svg_tree(markup)
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert '<B&"X>: 0 now' in texts
    [path] = [p for p in root.iter(f"{SVG}path") if p.get("class") == "series"]
    assert path.findtext(f"{SVG}title") == '<B&"X>: 0 now'


def test_an_empty_account_still_draws() -> None:
    _svg_tree(charts.position_svg([], T0))
    _svg_tree(charts.orders_per_day_svg(charts.orders_per_day([], date(2026, 1, 5))))

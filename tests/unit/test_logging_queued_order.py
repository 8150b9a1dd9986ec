"""The request id travels with a queued order, so the worker's lines carry the API's id: set
by the dispatcher from the bound ids, kept by the queue's codec, compatible both ways with
payloads queued without it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import attrs
from support import make_trader

from tradecore.log_fields import LogFields, current_log_fields, start_log_fields
from tradecore.orders import AlertAction, OrderRequest, OrderType, Source
from tradecore_adapters.redis import codec
from tradecore_entrypoints.system import System

AT = datetime(2026, 1, 5, 14, 30, tzinfo=UTC)


def order_request(**changes: object) -> OrderRequest:
    request = OrderRequest(
        request_id="r1",
        order_id="o1",
        user_id="u1",
        trading_account_id="a1",
        symbol="BTCUSDT",
        action=AlertAction.BUY,
        order_type=OrderType.ENTRY,
        quantity=Decimal("1.50"),
        source=Source.WEBHOOK,
        simulation=False,
        created_at=AT,
        expires_at=AT + timedelta(minutes=5),
        broker_name="paper",
    )
    return attrs.evolve(request, **changes)


def test_the_request_id_survives_the_codec() -> None:
    request = order_request(log_request_id="edge-7f3a")
    raw = codec.encode_request(request)

    assert '"log_request_id":"edge-7f3a"' in raw
    assert codec.decode_request(raw) == request
    assert codec.encode_request(codec.decode_request(raw)) == raw


def test_a_payload_without_it_decodes_and_re_encodes_to_its_text() -> None:
    """Queued by a process that predates the field, or with no request id bound."""
    raw = codec.encode_request(order_request())

    assert "log_request_id" not in raw
    decoded = codec.decode_request(raw)
    assert decoded.log_request_id is None
    assert codec.encode_request(decoded) == raw


async def test_the_dispatcher_puts_the_bound_request_id_on_the_queued_order(
    system: System,
) -> None:
    """Through the embedded runtime's webhook flow, with a request id bound as the HTTP
    middleware binds it; the dispatcher also binds the order, its user and its account for
    the request's remaining lines."""
    trader = await make_trader(system)
    queued: list[OrderRequest] = []
    push = system.queue.push

    async def recording_push(request: OrderRequest) -> bool:
        queued.append(request)
        return await push(request)

    system.queue.push = recording_push  # type: ignore[method-assign]
    start_log_fields(LogFields(request_id="edge-42"))
    try:
        await trader.send(trader.body())
        bound = current_log_fields()
    finally:
        start_log_fields(LogFields())

    # pushed once more after the user's worker started
    assert {(r.order_id, r.log_request_id) for r in queued} == {(queued[0].order_id, "edge-42")}
    request = queued[0]
    assert bound == LogFields(
        request_id="edge-42",
        user_id=trader.user.id,
        account_id=trader.account.account.id,
        order_id=request.order_id,
    )

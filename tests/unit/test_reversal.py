"""Auto-reversal: the planner's steps and the executor against the paper broker."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tradecore import reversal
from tradecore.errors import BrokerDisconnected, IllegalTransition
from tradecore.orders import (
    AlertAction,
    OrderStatus,
    OrderType,
    RejectionCode,
    Side,
    to_instruction,
)
from tradecore.ports.broker import BrokerOrder, BrokerOrderStatus
from tradecore.reversal import (
    REVERSAL_POLL_INTERVAL_S,
    REVERSAL_POLLS,
    BrokerStep,
    ExecutionOutcome,
    ExecutorState,
    StepRole,
    Trigger,
    client_order_id,
    execute,
    next_state,
    plan,
)
from tradecore.testing.clock import FakeClock, FakeSleeper
from tradecore_adapters.brokers.paper import PaperBroker, PaperExchange
from tradecore_adapters.brokers.script import Fill

ACCOUNT = "acct-1"
SYMBOL = "BTCUSDT"
BUY, SELL = AlertAction.BUY, AlertAction.SELL
ENTRY, EXIT = OrderType.ENTRY, OrderType.EXIT
CLOSE, ENT, EXI = StepRole.CLOSE, StepRole.ENTRY, StepRole.EXIT
D = Decimal
ONE = Decimal(1)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sleeper(clock: FakeClock) -> FakeSleeper:
    return FakeSleeper(clock)


@pytest.fixture
def exchange() -> PaperExchange:
    return PaperExchange()


@pytest.fixture
async def broker(exchange: PaperExchange, clock: FakeClock) -> PaperBroker:
    broker = PaperBroker(exchange, ACCOUNT, clock)
    await broker.connect()
    return broker


class Desk:
    """Runs signals for one account through plan + execute on the paper broker."""

    def __init__(self, exchange: PaperExchange, broker: PaperBroker, sleeper: FakeSleeper) -> None:
        self.exchange, self.broker, self.sleeper = exchange, broker, sleeper

    def hold(self, position: Decimal) -> None:
        self.exchange.set_position(ACCOUNT, SYMBOL, position)

    def position(self) -> Decimal:
        return self.exchange.position(ACCOUNT, SYMBOL)

    def orders(self) -> list[BrokerOrder]:
        return self.exchange.orders(ACCOUNT)

    def plan(
        self, action: AlertAction, order_type: OrderType = ENTRY, quantity: Decimal = ONE
    ) -> reversal.ExecutionPlan:
        return plan(self.position(), to_instruction(action, order_type), quantity)

    async def send(
        self,
        action: AlertAction,
        order_type: OrderType = ENTRY,
        quantity: Decimal = ONE,
        order_id: str = "ord-1",
    ) -> ExecutionOutcome:
        steps = self.plan(action, order_type, quantity)
        return await execute(self.broker, self.sleeper, order_id, SYMBOL, steps)


@pytest.fixture
def desk(exchange: PaperExchange, broker: PaperBroker, sleeper: FakeSleeper) -> Desk:
    return Desk(exchange, broker, sleeper)


def shape(p: reversal.ExecutionPlan) -> list[tuple[StepRole, Side, Decimal]]:
    return [(s.role, s.side, s.quantity) for s in p.steps]


# The specification's position table, row by row: (position, signal, step 1, step 2, final).
POSITION_TABLE = [
    (D(0), BUY, [], [(ENT, Side.BUY, D(1))], D(1)),
    (D(1), BUY, [], [(ENT, Side.BUY, D(1))], D(2)),
    (D(-2), BUY, [(CLOSE, Side.BUY, D(2))], [(ENT, Side.BUY, D(1))], D(1)),
    (D(0), SELL, [], [(ENT, Side.SELL, D(1))], D(-1)),
    (D(3), SELL, [(CLOSE, Side.SELL, D(3))], [(ENT, Side.SELL, D(1))], D(-1)),
    (D(-1), SELL, [], [(ENT, Side.SELL, D(1))], D(-2)),
]


@pytest.mark.parametrize(("position", "action", "step1", "step2", "final"), POSITION_TABLE)
def test_plan_follows_each_row_of_the_position_table(
    position: Decimal, action: AlertAction, step1: list, step2: list, final: Decimal
) -> None:
    p = plan(position, to_instruction(action), D(1))
    assert shape(p) == step1 + step2
    assert p.position_after == final
    assert p.auto_exit is bool(step1)
    assert p.exit_quantity == (step1[0][2] if step1 else 0)
    assert [s.reduce_only for s in p.steps] == [True] * len(step1) + [False]


@pytest.mark.parametrize(("position", "action", "step1", "step2", "final"), POSITION_TABLE)
async def test_execute_follows_each_row_of_the_position_table(
    desk: Desk, position: Decimal, action: AlertAction, step1: list, step2: list, final: Decimal
) -> None:
    desk.hold(position)
    outcome = await desk.send(action)
    assert outcome.status is OrderStatus.FILLED
    assert desk.position() == final
    placed = [(o.side, o.quantity, o.reduce_only) for o in desk.orders()]
    assert placed == [(side, q, role is CLOSE) for role, side, q in step1 + step2]
    assert outcome.auto_exit is bool(step1)
    assert outcome.exit_quantity == (step1[0][2] if step1 else 0)
    assert outcome.position_before == position
    assert outcome.filled_quantity == 1 and outcome.fill_price == D(60000)
    assert outcome.broker_refs == tuple(o.broker_order_id for o in desk.orders())
    assert outcome.main_client_order_id == "ord-1-entry"
    assert desk.sleeper.slept == []  # the paper close fills at once: no polling needed


async def test_reversal_reports_the_close_order(desk: Desk) -> None:
    desk.hold(D(-2))
    outcome = await desk.send(BUY)
    close = desk.orders()[0]
    assert outcome.exit_order_result == {
        "broker_order_id": close.broker_order_id,
        "client_order_id": "ord-1-close",
        "side": "buy",
        "quantity": "2",
        "status": "filled",
        "filled_quantity": "2",
        "average_price": "60000",
    }


async def test_same_direction_entry_adds_to_the_position_without_a_close(desk: Desk) -> None:
    desk.hold(D(3))
    outcome = await desk.send(BUY, quantity=D(2))
    assert desk.position() == 5
    assert not outcome.auto_exit and outcome.exit_order_result is None


# -- exits are reduce-only ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("position", "action", "quantity", "expected_steps", "final"),
    [
        (D(3), SELL, D(1), [(EXI, Side.SELL, D(1))], D(2)),
        (D(3), SELL, D(5), [(EXI, Side.SELL, D(3))], D(0)),  # capped: never flips short
        (D(-2), BUY, D(1), [(EXI, Side.BUY, D(1))], D(-1)),
        (D(-2), BUY, D(9), [(EXI, Side.BUY, D(2))], D(0)),
        (D(-2), SELL, D(1), [], D(-2)),  # sell-exit closes longs; a short is left alone
        (D(3), BUY, D(1), [], D(3)),
        (D(0), SELL, D(1), [], D(0)),
        (D(0), BUY, D(1), [], D(0)),
    ],
)
async def test_exits_only_reduce_the_position_on_their_side(
    desk: Desk,
    position: Decimal,
    action: AlertAction,
    quantity: Decimal,
    expected_steps: list,
    final: Decimal,
) -> None:
    desk.hold(position)
    p = desk.plan(action, EXIT, quantity)
    assert shape(p) == expected_steps
    assert all(s.reduce_only for s in p.steps)
    outcome = await desk.send(action, EXIT, quantity)
    assert desk.position() == final
    assert all(o.reduce_only for o in desk.orders())
    if expected_steps:
        assert outcome.status is OrderStatus.FILLED
        assert outcome.main_client_order_id == "ord-1-exit"
    else:
        assert outcome.status is OrderStatus.NO_POSITION
        assert desk.orders() == [] and outcome.broker_refs == ()
        assert outcome.main_client_order_id is None


@pytest.mark.parametrize(
    ("position", "action", "final", "closes"),
    [
        (D(3), AlertAction.CLOSE_LONG, D(0), True),
        (D(-2), AlertAction.CLOSE_LONG, D(-2), False),
        (D(0), AlertAction.CLOSE_LONG, D(0), False),
        (D(-2), AlertAction.CLOSE_SHORT, D(0), True),
        (D(3), AlertAction.CLOSE_SHORT, D(3), False),
        (D(0), AlertAction.CLOSE_SHORT, D(0), False),
    ],
)
async def test_close_closes_the_whole_side_or_succeeds_with_nothing_to_do(
    desk: Desk, position: Decimal, action: AlertAction, final: Decimal, closes: bool
) -> None:
    desk.hold(position)
    outcome = await desk.send(action, quantity=D(1))  # the quantity does not limit a close
    assert desk.position() == final
    if closes:
        assert outcome.status is OrderStatus.FILLED
        assert outcome.filled_quantity == abs(position)
        [order] = desk.orders()
        assert order.reduce_only and order.client_order_id == "ord-1-exit"
        assert not outcome.auto_exit
    else:
        assert outcome.status is OrderStatus.NO_POSITION and outcome.error is None
        assert desk.orders() == []


def test_entries_and_exits_need_a_positive_quantity() -> None:
    for bad in (D(0), D(-1), D("NaN"), D("Infinity")):
        with pytest.raises(ValueError, match="quantity"):
            plan(D(0), to_instruction(BUY), bad)
        with pytest.raises(ValueError, match="quantity"):
            plan(D(1), to_instruction(SELL, EXIT), bad)


# -- waiting for the close ------------------------------------------------------------------


async def test_close_that_never_fills_aborts_with_reversal_timeout_and_no_entry(
    desk: Desk,
) -> None:
    desk.hold(D(-2))
    desk.exchange.delay_next_fill(None)
    outcome = await desk.send(BUY)
    assert outcome.status is OrderStatus.FAILED
    assert outcome.error is not None and outcome.error.code is RejectionCode.REVERSAL_TIMEOUT
    assert "manual intervention" in outcome.error.message.lower()
    [close] = desk.orders()  # the entry was never placed
    assert close.client_order_id == "ord-1-close" and close.status is BrokerOrderStatus.PENDING
    assert desk.sleeper.slept == [REVERSAL_POLL_INTERVAL_S] * REVERSAL_POLLS
    assert sum(desk.sleeper.slept) == 5.0
    assert desk.position() == -2
    assert outcome.broker_refs == (close.broker_order_id,)
    assert outcome.main_client_order_id is None  # nothing for fill verification to follow
    assert not outcome.auto_exit and outcome.exit_quantity == 0
    assert outcome.exit_order_result is not None
    assert outcome.exit_order_result["status"] == "pending"


async def test_close_filling_on_the_last_poll_still_enters(desk: Desk) -> None:
    desk.hold(D(-2))
    desk.exchange.delay_next_fill(REVERSAL_POLLS)
    outcome = await desk.send(BUY)
    assert outcome.status is OrderStatus.FILLED and outcome.auto_exit
    assert desk.sleeper.slept == [REVERSAL_POLL_INTERVAL_S] * REVERSAL_POLLS
    assert desk.position() == 1


async def test_close_filling_after_some_polls_enters_without_waiting_longer(desk: Desk) -> None:
    desk.hold(D(3))
    desk.exchange.partially_fill_next(D("0.5"), rest_after_polls=3)
    outcome = await desk.send(SELL)
    assert outcome.status is OrderStatus.FILLED
    assert outcome.auto_exit and outcome.exit_quantity == 3
    assert desk.sleeper.slept == [REVERSAL_POLL_INTERVAL_S] * 3
    assert desk.position() == -1


async def test_close_partially_filled_at_timeout_reports_what_it_closed(desk: Desk) -> None:
    desk.hold(D(4))
    desk.exchange.partially_fill_next(D("0.25"))
    outcome = await desk.send(SELL)
    assert outcome.error is not None and outcome.error.code is RejectionCode.REVERSAL_TIMEOUT
    assert outcome.exit_quantity == 1 and not outcome.auto_exit
    assert desk.position() == 3
    assert len(desk.orders()) == 1


async def test_rejected_close_places_no_entry(desk: Desk) -> None:
    desk.hold(D(-2))
    desk.exchange.reject_next(RejectionCode.MARKET_CLOSED, message="closed for the test")
    outcome = await desk.send(BUY)
    assert outcome.status is OrderStatus.REJECTED
    assert outcome.error is not None
    assert outcome.error.code is RejectionCode.MARKET_CLOSED
    assert outcome.error.message == "closed for the test"
    [close] = desk.orders()
    assert close.status is BrokerOrderStatus.REJECTED
    assert desk.position() == -2
    assert not outcome.auto_exit and outcome.main_client_order_id is None


class VanishingPosition(PaperBroker):
    """Someone flattens the account by hand while the close is being polled."""

    async def order_status(self, client_order_id: str, symbol: str) -> BrokerOrder | None:
        self.exchange.set_position(self.account_id, SYMBOL, D(0))
        return await super().order_status(client_order_id, symbol)


async def test_close_cancelled_while_polled_places_no_entry(
    exchange: PaperExchange, clock: FakeClock, sleeper: FakeSleeper
) -> None:
    broker = VanishingPosition(exchange, ACCOUNT, clock)
    await broker.connect()
    exchange.set_position(ACCOUNT, SYMBOL, D(-2))
    exchange.delay_next_fill(2)
    p = plan(D(-2), to_instruction(BUY), D(1))
    outcome = await execute(broker, sleeper, "ord-9", SYMBOL, p)
    assert outcome.status is OrderStatus.CANCELLED
    assert outcome.error is not None
    assert outcome.error.code is RejectionCode.REVERSAL_CLOSE_FAILED
    assert [o.client_order_id for o in exchange.orders(ACCOUNT)] == ["ord-9-close"]
    assert sleeper.slept == [REVERSAL_POLL_INTERVAL_S] * 2
    assert not outcome.auto_exit


# -- the main order's own status ------------------------------------------------------------


async def test_partially_filled_entry_is_reported_and_followed(desk: Desk) -> None:
    desk.exchange.partially_fill_next(D("0.5"))
    outcome = await desk.send(BUY, quantity=D(4))
    assert outcome.status is OrderStatus.PARTIALLY_FILLED
    assert outcome.filled_quantity == 2 and outcome.fill_price == D(60000)
    assert outcome.main_client_order_id == "ord-1-entry"
    assert desk.sleeper.slept == []  # only a close is polled; the entry goes to verification


async def test_pending_entry_after_a_reversal(desk: Desk) -> None:
    desk.hold(D(-1))
    desk.exchange.script(Fill(), Fill.delayed(None))  # the close fills, the entry waits
    outcome = await desk.send(BUY)
    assert outcome.status is OrderStatus.PENDING
    assert outcome.auto_exit and outcome.exit_quantity == 1
    assert outcome.filled_quantity == 0 and outcome.fill_price is None
    assert outcome.main_client_order_id == "ord-1-entry"
    assert len(outcome.broker_refs) == 2
    assert desk.position() == 0


# -- rejections and the broker's rate limit -------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        RejectionCode.INSUFFICIENT_MARGIN,
        RejectionCode.MARKET_CLOSED,
        RejectionCode.INVALID_SYMBOL,
        RejectionCode.POSITION_MODE_MISMATCH,
    ],
)
async def test_each_scripted_rejection_is_a_result_with_its_code(
    desk: Desk, code: RejectionCode
) -> None:
    desk.exchange.reject_next(code)
    outcome = await desk.send(BUY)
    assert outcome.status is OrderStatus.REJECTED
    assert outcome.error is not None and outcome.error.code is code and outcome.error.message
    assert outcome.main_client_order_id is None  # nothing to verify
    assert desk.position() == 0
    assert outcome.broker_refs == (desk.orders()[0].broker_order_id,)


async def test_rejections_produced_by_the_paper_broker_itself(
    desk: Desk, clock: FakeClock, sleeper: FakeSleeper
) -> None:
    async def send(symbol: str, quantity: Decimal, order_id: str) -> ExecutionOutcome:
        p = plan(D(0), to_instruction(BUY), quantity)
        return await execute(desk.broker, sleeper, order_id, symbol, p)

    unknown = await send("DOGEPEPE", D(1), "a")
    hedge = await send("ETHUSDT", D(1), "b")
    margin = await send("ES", D(100), "c")
    clock.set(clock.now().replace(day=10))  # Saturday 10 January 2026
    closed = await send("ES", D(1), "d")
    errors = [o.error for o in (unknown, hedge, margin, closed)]
    assert [e.code if e else None for e in errors] == [
        RejectionCode.INVALID_SYMBOL,
        RejectionCode.POSITION_MODE_MISMATCH,
        RejectionCode.INSUFFICIENT_MARGIN,
        RejectionCode.MARKET_CLOSED,
    ]
    messages = [e.message if e else "" for e in errors]
    assert "symbol not found in broker contracts" in messages[0]
    assert "one-way mode" in messages[1]
    assert "Sunday 17:00" in messages[3] and "America/Chicago" in messages[3]
    assert all(o.status is OrderStatus.REJECTED for o in (unknown, hedge, margin, closed))


async def test_rate_limited_step_is_retried_after_the_brokers_delay(desk: Desk) -> None:
    desk.exchange.reject_next(RejectionCode.BROKER_RATE_LIMITED, retry_after=2.0, count=2)
    outcome = await desk.send(BUY)
    assert outcome.status is OrderStatus.FILLED and outcome.error is None
    assert desk.sleeper.slept == [2.0, 2.0]
    assert len(desk.orders()) == 1 and desk.position() == 1


async def test_rate_limit_beyond_two_retries_returns_the_error(desk: Desk) -> None:
    desk.exchange.reject_next(RejectionCode.BROKER_RATE_LIMITED, retry_after=1.5, count=3)
    outcome = await desk.send(BUY)
    assert outcome.status is OrderStatus.REJECTED
    assert outcome.error is not None
    assert outcome.error.code is RejectionCode.BROKER_RATE_LIMITED
    assert outcome.error.retry_after == 1.5
    assert desk.sleeper.slept == [1.5, 1.5]
    assert desk.orders() == [] and outcome.broker_refs == ()


async def test_long_rate_limit_wait_is_not_slept_but_returned(desk: Desk) -> None:
    desk.exchange.reject_next(RejectionCode.BROKER_RATE_LIMITED, retry_after=30.0)
    outcome = await desk.send(BUY)
    assert outcome.error is not None and outcome.error.retry_after == 30.0
    assert desk.sleeper.slept == []
    assert desk.position() == 0


async def test_rate_limited_close_is_retried_then_the_reversal_completes(desk: Desk) -> None:
    desk.hold(D(2))
    desk.exchange.reject_next(RejectionCode.BROKER_RATE_LIMITED, retry_after=5.0)
    outcome = await desk.send(SELL)
    assert outcome.status is OrderStatus.FILLED and outcome.auto_exit
    assert desk.sleeper.slept == [5.0]
    assert desk.position() == -1


# -- crashes and disconnects ------------------------------------------------------------------


async def test_re_executing_the_same_plan_places_nothing_twice(desk: Desk) -> None:
    desk.hold(D(-2))
    p = desk.plan(BUY)
    first = await execute(desk.broker, desk.sleeper, "ord-7", SYMBOL, p)
    second = await execute(desk.broker, desk.sleeper, "ord-7", SYMBOL, p)
    assert len(desk.orders()) == 2
    assert desk.position() == 1
    assert second == first


async def test_disconnect_propagates(desk: Desk) -> None:
    desk.exchange.disconnect(ACCOUNT)
    with pytest.raises(BrokerDisconnected):
        await desk.send(BUY)
    assert desk.orders() == []


async def test_crash_between_close_and_entry_is_recovered_by_re_execution(desk: Desk) -> None:
    desk.hold(D(-2))
    p = desk.plan(BUY)
    desk.exchange.disconnect(ACCOUNT, after_calls=1)  # the close goes through, then the line drops
    with pytest.raises(BrokerDisconnected):
        await execute(desk.broker, desk.sleeper, "ord-3", SYMBOL, p)
    assert desk.position() == 0
    await desk.broker.connect()
    outcome = await execute(desk.broker, desk.sleeper, "ord-3", SYMBOL, p)
    assert outcome.status is OrderStatus.FILLED and outcome.auto_exit
    assert [o.client_order_id for o in desk.orders()] == ["ord-3-close", "ord-3-entry"]
    assert desk.position() == 1


# -- identifiers and the transition table -----------------------------------------------------


def test_client_order_ids_are_deterministic_and_distinct_per_step() -> None:
    p = plan(D(-2), to_instruction(BUY), D(1))
    ids = [client_order_id("ord-1", s) for s in p.steps]
    assert ids == ["ord-1-close", "ord-1-entry"]
    again = plan(D(-2), to_instruction(BUY), D(1))
    assert [client_order_id("ord-1", s) for s in again.steps] == ids
    exit_step = BrokerStep(StepRole.EXIT, Side.SELL, D(1), True)
    assert client_order_id("ord-1", exit_step) == "ord-1-exit"


def test_terminal_states_have_no_transitions_and_illegal_ones_raise() -> None:
    for state in (ExecutorState.DONE, ExecutorState.ABORTED):
        for trigger in Trigger:
            with pytest.raises(IllegalTransition) as raised:
                next_state(state, trigger)
            assert str(state) in str(raised.value) and str(trigger) in str(raised.value)
    with pytest.raises(IllegalTransition):
        next_state(ExecutorState.PLACING, Trigger.TIMED_OUT)  # only a close times out
    assert next_state(ExecutorState.CLOSING, Trigger.CLOSE_FILLED) is ExecutorState.PLACING
    assert next_state(ExecutorState.AWAITING_CLOSE_FILL, Trigger.TIMED_OUT) is ExecutorState.ABORTED

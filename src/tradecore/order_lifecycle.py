"""The order-history row's lifecycle: named, typed changes and the table of legal moves.

A row is born ``queued``, the durable intent. The worker then claims it (``submitted``), or
finds it waited past its ``expires_at`` (``expired``), or cannot reach the broker to claim it
(``failed``, nothing sent); or the API, unable to hand it over, withdraws it (``cancelled``).
A ``submitted`` row is settled by its execution in the status the broker's answer maps to, or
``failed`` when the broker connection dropped for good mid-execution. A queued row whose
execution needed no claim (a venue that keeps nothing of a placement until the outcome
commits with it) is claimed and settled in one write (``ClaimedAndExecuted``). Fill checks
then write the broker's later view over a row that has broker orders.

Each kind of change is a frozen value that knows the record fields it writes (``fields()``,
``status`` included when the change sets one). ``TRANSITIONS`` says, for a status and a step,
which statuses the step may lead to from there; ``next_status`` applies a change to a status
and ``sources`` gives the statuses a change may leave, the compare-and-set of
``OrderHistory.transition``. Both raise ``IllegalTransition`` for a move the table lacks.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from typing import ClassVar, TypeAlias

import attrs

from tradecore.errors import IllegalTransition
from tradecore.orders import OrderError, OrderStatus


class Step(enum.StrEnum):
    """The kinds of change, one per change class."""

    CLAIM = "claim"  # Submitted
    EXPIRE = "expire"  # Expired
    WITHDRAW = "withdraw"  # Withdrawn
    FAIL_CLAIM = "fail_claim"  # ClaimFailed
    INTERRUPT = "interrupt"  # Interrupted
    EXECUTE = "execute"  # Executed
    CLAIM_AND_EXECUTE = "claim_and_execute"  # ClaimedAndExecuted
    CHECK_FILL = "check_fill"  # FillChecked
    RECORD_FILL = "record_fill"  # FillRecorded


@attrs.frozen
class Submitted:
    """The worker claimed the queued order, with the position its broker steps start from."""

    step: ClassVar[Step] = Step.CLAIM
    status: ClassVar[OrderStatus] = OrderStatus.SUBMITTED

    submitted_at: datetime
    position_before: Decimal

    def fields(self) -> dict[str, object]:
        return {
            "status": self.status,
            "submitted_at": self.submitted_at,
            "position_before": self.position_before,
        }


@attrs.frozen
class Expired:
    """The order waited past its ``expires_at``: it is never sent late."""

    step: ClassVar[Step] = Step.EXPIRE
    status: ClassVar[OrderStatus] = OrderStatus.EXPIRED

    error: OrderError

    def fields(self) -> dict[str, object]:
        return {"status": self.status, "error": self.error}


@attrs.frozen
class Withdrawn:
    """The API could not hand the order over: the intent is cancelled and its replay
    fingerprint freed (set to None), since the order never executed."""

    step: ClassVar[Step] = Step.WITHDRAW
    status: ClassVar[OrderStatus] = OrderStatus.CANCELLED

    def fields(self) -> dict[str, object]:
        return {"status": self.status, "fingerprint": None}


@attrs.frozen
class ClaimFailed:
    """The worker could not reach the broker to read the position: the order fails before
    it is claimed, and nothing was sent."""

    step: ClassVar[Step] = Step.FAIL_CLAIM
    status: ClassVar[OrderStatus] = OrderStatus.FAILED

    error: OrderError

    def fields(self) -> dict[str, object]:
        return {"status": self.status, "error": self.error}


@attrs.frozen
class Interrupted:
    """The broker connection dropped for good while the claimed order's steps were being
    sent: the order fails, and some of its steps may have reached the broker."""

    step: ClassVar[Step] = Step.INTERRUPT
    status: ClassVar[OrderStatus] = OrderStatus.FAILED

    error: OrderError

    def fields(self) -> dict[str, object]:
        return {"status": self.status, "error": self.error}


@attrs.frozen
class Executed:
    """The claimed order's execution settled it (``reversal.ExecutionOutcome``): every field
    is written, None values included, so the row shows this execution and nothing older."""

    step: ClassVar[Step] = Step.EXECUTE

    status: OrderStatus
    order_id: str | None
    client_order_id: str | None
    broker_refs: tuple[str, ...]
    fill_price: Decimal | None
    fill_quantity: Decimal
    filled_at: datetime | None
    auto_exit: bool
    exit_quantity: Decimal
    exit_order_result: dict[str, str] | None
    error: OrderError | None
    placed_at: datetime | None = None  # when the broker's answer to the placement came

    def fields(self) -> dict[str, object]:
        return {
            "status": self.status,
            "placed_at": self.placed_at,
            "order_id": self.order_id,
            "client_order_id": self.client_order_id,
            "broker_refs": self.broker_refs,
            "fill_price": self.fill_price,
            "fill_quantity": self.fill_quantity,
            "filled_at": self.filled_at,
            "auto_exit": self.auto_exit,
            "exit_quantity": self.exit_quantity,
            "exit_order_result": self.exit_order_result,
            "error": self.error,
        }


@attrs.frozen
class ClaimedAndExecuted:
    """The claim and the execution of a queued order in one write, for a venue that keeps
    nothing of a placement until the order's outcome commits with it (the paper broker in
    real mode, ``SavesWithOrder``). A claim exists so that a placement is never made twice;
    where the placement is stored only by this write, its compare-and-set from ``queued`` is
    that guarantee: of two executions of one order, one write takes and the other's
    placement is dropped with it. Writes the fields of both, the execution's status."""

    step: ClassVar[Step] = Step.CLAIM_AND_EXECUTE

    claim: Submitted
    execution: Executed

    @property
    def status(self) -> OrderStatus:
        return self.execution.status

    def fields(self) -> dict[str, object]:
        return {**self.claim.fields(), **self.execution.fields()}


@attrs.frozen
class ReportedFill:
    """What the broker reported filled of the main order; written as ``fill_quantity`` and
    ``fill_price`` (None too: the broker has no average price yet)."""

    quantity: Decimal
    price: Decimal | None


@attrs.frozen
class FillChecked:
    """A fill check decided the row's status (``fills.decide``). ``fill`` is None when the
    broker did not know the order (nothing else is written); ``filled_at`` is written only
    when set (the check settled the order filled)."""

    step: ClassVar[Step] = Step.CHECK_FILL

    status: OrderStatus
    fill: ReportedFill | None = None
    filled_at: datetime | None = None

    def fields(self) -> dict[str, object]:
        written: dict[str, object] = {"status": self.status}
        if self.fill is not None:
            written["fill_quantity"] = self.fill.quantity
            written["fill_price"] = self.fill.price
        if self.filled_at is not None:
            written["filled_at"] = self.filled_at
        return written


@attrs.frozen
class FillRecorded:
    """A fill check that decided no status (a dead letter) records the fill the broker
    reported; the status stays as it is."""

    step: ClassVar[Step] = Step.RECORD_FILL
    status: ClassVar[None] = None

    fill: ReportedFill

    def fields(self) -> dict[str, object]:
        return {"fill_quantity": self.fill.quantity, "fill_price": self.fill.price}


OrderChange: TypeAlias = (
    Submitted
    | Expired
    | Withdrawn
    | ClaimFailed
    | Interrupted
    | Executed
    | ClaimedAndExecuted
    | FillChecked
    | FillRecorded
)

_OS = OrderStatus


def _to(*statuses: OrderStatus) -> frozenset[OrderStatus]:
    return frozenset(statuses)


# What an execution settles a submitted row in (reversal.ExecutionOutcome): the main order's
# status as the broker answered it, ``failed`` for a reversal whose close did not fill in
# time, ``no_position`` for an exit or close with nothing to reduce.
EXECUTION_OUTCOMES = _to(
    _OS.PENDING,
    _OS.PARTIALLY_FILLED,
    _OS.FILLED,
    _OS.CANCELLED,
    _OS.REJECTED,
    _OS.FAILED,
    _OS.NO_POSITION,
)
# What a fill check writes (fills.decide): the broker's later view of the main order.
CHECK_OUTCOMES = EXECUTION_OUTCOMES - {_OS.NO_POSITION}
# The rows a fill check writes over. ``submitted`` too: a check trusts the broker, even over a
# row whose outcome write it does not see. Surprising: ``filled`` is terminal, yet a check
# still writes over it: placement recorded the broker's answer of the moment, the check its
# later word (a final fill price, in principle another status), and the later word wins.
CHECKED = (_OS.SUBMITTED, _OS.PENDING, _OS.PARTIALLY_FILLED, _OS.FILLED)

# (status, step) -> the statuses the step may lead to from there.
TRANSITIONS: dict[tuple[OrderStatus, Step], frozenset[OrderStatus]] = {
    (_OS.QUEUED, Step.CLAIM): _to(_OS.SUBMITTED),
    (_OS.QUEUED, Step.EXPIRE): _to(_OS.EXPIRED),
    (_OS.QUEUED, Step.WITHDRAW): _to(_OS.CANCELLED),
    # Only from queued: a row another worker already claimed is that worker's to settle.
    (_OS.QUEUED, Step.FAIL_CLAIM): _to(_OS.FAILED),
    (_OS.SUBMITTED, Step.INTERRUPT): _to(_OS.FAILED),
    (_OS.SUBMITTED, Step.EXECUTE): EXECUTION_OUTCOMES,
    # Only from queued: the compare-and-set that takes is this order's one placement.
    (_OS.QUEUED, Step.CLAIM_AND_EXECUTE): EXECUTION_OUTCOMES,
    **{(status, Step.CHECK_FILL): CHECK_OUTCOMES for status in CHECKED},
    # Writes the fill only: each row keeps its status.
    **{(status, Step.RECORD_FILL): _to(status) for status in CHECKED},
}


def describe(change: OrderChange) -> str:
    """The change as a transition's trigger reads: its step, and the status it asks for."""
    return _trigger(change.step, change.status)


def _trigger(step: Step, status: OrderStatus | None) -> str:
    return step if status is None else f"{step} to {status}"


def next_status(status: OrderStatus, change: OrderChange) -> OrderStatus:
    """The status a row in ``status`` has after ``change`` (a change without a status keeps
    it). Raises IllegalTransition, naming ``status`` and the change, when the table does not
    allow the move."""
    following = status if change.status is None else change.status
    if following not in TRANSITIONS.get((status, change.step), ()):
        raise IllegalTransition(status, describe(change))
    return following


def sources(change: OrderChange) -> frozenset[OrderStatus]:
    """Every status ``change`` may leave: the compare-and-set of ``OrderHistory.transition``.
    Raises IllegalTransition when there is none (a change the table allows from no status),
    naming the statuses its step leaves and the status asked for."""
    return _sources(change.step, change.status)


@functools.cache
def _sources(step: Step, status: OrderStatus | None) -> frozenset[OrderStatus]:
    found = frozenset(
        source
        for source in OrderStatus
        if (source if status is None else status) in TRANSITIONS.get((source, step), ())
    )
    if not found:
        leaves = [s for s in OrderStatus if (s, step) in TRANSITIONS]
        raise IllegalTransition(_either(leaves), _trigger(step, status))
    return found


class PlacementKept(enum.Enum):
    """Whether the venue state a placement changed is stored with the order's next change
    (``SavesWithOrder``), by what that change is."""

    ALWAYS = "always"  # the order was claimed first: store what the venue did, CAS or not
    IF_APPLIED = "if_applied"  # placed unclaimed: only its execution's write, if it takes
    NEVER = "never"  # placed unclaimed, and this change is not that execution


def placement_kept(change: OrderChange) -> PlacementKept:
    """For a placement waiting for the order's next change: a change that leaves a status
    other than ``queued`` comes after a claim, so what the venue did is kept whatever its
    compare-and-set finds; one that leaves ``queued`` follows a placement made unclaimed,
    which only ``ClaimedAndExecuted`` records, and only if it takes."""
    if OrderStatus.QUEUED not in sources(change):
        return PlacementKept.ALWAYS
    if isinstance(change, ClaimedAndExecuted):
        return PlacementKept.IF_APPLIED
    return PlacementKept.NEVER


def _either(statuses: Iterable[OrderStatus]) -> str:
    names = [str(s) for s in statuses]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"

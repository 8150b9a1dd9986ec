"""A cancellation that a library absorbs still stops the process's loops.

redis-py can swallow a cancellation that lands inside a read with a timeout: the read
returns normally and the task goes on. Before ``raise_if_cancelled``, the fill verifier's
loop then never ended and a worker host ignored SIGTERM until it was killed (seen in the
fault suite: ``test_a_worker_stopped_with_sigterm_hands_its_users_over_at_once``). Here the
fill-task queue and worker-control wait absorb every cancellation, as that read can; stopping
the system must still end.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from tradecore_entrypoints.system import FillPolling, System

STOP_BOUND_S = 10.0  # only a hang comes near it: a stop takes milliseconds here


class Absorbing:
    """Waits made to behave like a redis-py read with a timeout that swallowed the
    cancellation: a cancelled call returns what an idle wait returns (``idle``), while
    ``on``. ``absorbed`` counts the cancellations swallowed."""

    def __init__(self) -> None:
        self.on = True
        self.absorbed = 0

    def __call__(self, wait: Any, idle: Any = None) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return await wait(*args, **kwargs)
            except asyncio.CancelledError:
                if self.on:
                    self.absorbed += 1
                    return idle
                raise

        return call


async def test_stopping_ends_loops_whose_waits_absorb_the_cancellation(
    embedded: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    absorbing = Absorbing()
    # The verifier's loop waits in the fill-task queue's receive (inside ``run_batch``), as
    # it does on Redis, not in the memory set's idle pause
    embedded.fill_polling = FillPolling(wait_s=5.0, idle_s=0.0)
    fill_tasks = embedded.fill_tasks
    monkeypatch.setattr(fill_tasks, "receive_many", absorbing(fill_tasks.receive_many, []))
    directory = embedded.directory
    monkeypatch.setattr(directory, "next_start_request", absorbing(directory.next_start_request))
    await embedded.start(workers=True, verify_fills=True)
    await asyncio.sleep(0.05)  # both loops are in their waits
    stopping = asyncio.create_task(embedded.stop())
    try:
        # asyncio.wait, not wait_for: cancelling a stop that hangs would hang as well
        done, _ = await asyncio.wait({stopping}, timeout=STOP_BOUND_S)
        assert stopping in done, "stop() did not end: a loop went on after its cancellation"
        stopping.result()
        assert absorbing.absorbed == 2, "each loop's cancellation landed in its wait"
    finally:
        # a failed run must not hang the test's teardown too: cancel again, unabsorbed
        absorbing.on = False
        stopping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopping


async def test_a_cancellation_absorbed_by_the_sweep_ends_worker_control_before_its_wait(
    embedded: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control loop's turn sweeps for orphaned users, then waits for a start request. A
    SIGTERM that lands in the sweep's SCAN (absorbed) must end the loop before that wait, or
    the host's shutdown lasts as long as the wait."""
    absorbing = Absorbing()
    directory = embedded.directory

    async def scanning() -> list[str]:
        await asyncio.Event().wait()  # a slow SCAN: the stop lands in it
        return []

    async def waiting_long(timeout_s: float) -> str | None:
        await asyncio.sleep(STOP_BOUND_S * 6)  # longer than the bound below
        return None

    monkeypatch.setattr(directory, "orphaned_users", absorbing(scanning, []))
    monkeypatch.setattr(directory, "next_start_request", waiting_long)
    await embedded.start(workers=True, verify_fills=False)
    await asyncio.sleep(0.05)  # the control loop is in its sweep
    stopping = asyncio.create_task(embedded.stop())
    try:
        done, _ = await asyncio.wait({stopping}, timeout=STOP_BOUND_S)
        assert stopping in done, "stop() waited for the start-request wait after the sweep"
        stopping.result()
        assert absorbing.absorbed == 1
    finally:
        absorbing.on = False
        stopping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopping

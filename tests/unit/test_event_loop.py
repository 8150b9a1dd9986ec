"""The long-running commands run on uvloop where it is installed."""

from __future__ import annotations

import asyncio

import pytest

from tradecore_entrypoints.loop import loop_factory, run_fast


def test_run_fast_returns_the_result_on_uvloop() -> None:
    uvloop = pytest.importorskip("uvloop")

    async def which_loop() -> type[asyncio.AbstractEventLoop]:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop())

    assert run_fast(which_loop()) is uvloop.Loop
    assert loop_factory() is uvloop.new_event_loop


def test_run_fast_propagates_the_exception() -> None:
    async def fail() -> None:
        raise LookupError("boom")

    with pytest.raises(LookupError, match="boom"):
        run_fast(fail())

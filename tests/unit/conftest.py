"""Fixtures for flow tests: the embedded system on a fake clock, and a provisioned trader."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from support import Trader, fast_hasher, make_trader

from tradecore.services.execution.worker_host import HostSettings
from tradecore.services.orders.settings import OrderSettings
from tradecore.testing.clock import FakeClock, FakeSleeper, SeededRandom
from tradecore_entrypoints.container import build_embedded
from tradecore_entrypoints.system import System


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def settings() -> OrderSettings:
    return OrderSettings()


@pytest.fixture
def embedded(clock: FakeClock, settings: OrderSettings) -> System:
    return build_embedded(
        clock=clock,
        sleeper=FakeSleeper(clock),
        random=SeededRandom(7),
        settings=settings,
        host_settings=HostSettings(poll_s=0.005),
        hasher=fast_hasher(),
    )


@pytest.fixture
async def system(embedded: System) -> AsyncIterator[System]:
    async with embedded.running(verify_fills=False):
        yield embedded


@pytest.fixture
async def trader(system: System) -> Trader:
    return await make_trader(system)

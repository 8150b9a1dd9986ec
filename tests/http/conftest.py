"""Fixtures for the HTTP tests: the app over the embedded runtime on a fake clock."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from http_support import Env, Trader, running


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with running() as env:
        yield env


@pytest.fixture
async def trader(env: Env) -> Trader:
    return await env.trader()

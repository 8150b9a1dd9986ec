"""Two awaitables run together, one of them the answer: a step whose side effect may proceed
while the main step does (the success audit entry while the worker replies; the fill check's
send while the order's result commits)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def alongside(main: Awaitable[T], side: Awaitable[object]) -> T:
    """Await both concurrently and return ``main``'s value once both are done; the side's
    exception first, then the main's, is raised after both are done. Cancelled, it cancels
    the side.

    The side runs as one task and ``main`` in the caller's own, which costs one task where
    ``asyncio.gather`` would wrap both."""
    side_task = asyncio.ensure_future(side)
    try:
        got = await main
    except asyncio.CancelledError:
        side_task.cancel()
        raise
    except BaseException:
        await side_task  # its exception, if any, is raised first (the main's is its context)
        raise
    await side_task
    return got

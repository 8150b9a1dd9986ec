"""How the long-running commands run their event loop.

``serve`` and ``worker`` spend most of their CPU in the event loop and on sockets (one webhook
costs a dozen round trips to Postgres and Redis), so they run on uvloop, libuv's event loop for
asyncio, where it is installed (it is a dependency of the ``server`` extra on Linux and macOS);
elsewhere they fall back to asyncio's own loop. Short commands (migrate, admin) use asyncio's
loop: their time is in the round trips, not the loop.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory, or None (asyncio's default loop) where uvloop is missing."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a platform without uvloop
        return None
    return uvloop.new_event_loop


def run_fast(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the fastest available loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


def settle_heap() -> None:
    """Tune the garbage collector once startup is done (``serve``, ``worker``, and the
    benchmark server that stands in for ``serve``): the objects made so far live for the whole
    process, so they are collected once and frozen out of every later collection, and young
    objects are collected less often (the collector causes most latency outliers of the
    embedded runtime; in a worker host, whose per-user workers and paper books pile up in the
    oldest generation, the default thresholds cost a fifth of its CPU per order in the closed
    loop: docs/performance.md)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)

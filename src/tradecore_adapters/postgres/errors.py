"""Driver errors translated into the core's ``DatabaseUnavailable``.

Translated: every ``psycopg.OperationalError`` (connection refused or lost, statement timeout,
serialization failure, deadlock), the pool's ``PoolTimeout`` and ``PoolClosed`` (both
operational errors), and ``InterfaceError`` (a closed connection). Everything else (a
constraint violation, bad SQL) is a programming error and propagates unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

import psycopg

from tradecore.errors import DatabaseUnavailable

_UNAVAILABLE = (psycopg.OperationalError, psycopg.InterfaceError)

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def database_errors() -> Iterator[None]:
    """Raise ``DatabaseUnavailable`` (chained) for a driver error meaning the database could
    not serve the request in time."""
    try:
        yield
    except _UNAVAILABLE as e:
        raise DatabaseUnavailable(f"database unavailable: {type(e).__name__}") from e


def translated(
    fn: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """Decorate an async function so driver errors surface as ``DatabaseUnavailable``."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with database_errors():
            return await fn(*args, **kwargs)

    return wrapper

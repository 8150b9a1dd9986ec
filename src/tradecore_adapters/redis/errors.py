"""Translation of redis-py failures into the core's ``KeyValueStoreUnavailable``.

Only failures of availability are translated: the server could not be reached or answered in
time, is loading, read-only (a failover in progress), out of memory, or a cluster slot is down
(or no node of a cluster answers while the client reads its slot map). Anything else (a wrong
type, a script error, a cross-slot call) is a bug and propagates unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis import exceptions as rx

from tradecore.errors import KeyValueStoreUnavailable

UNAVAILABLE: tuple[type[BaseException], ...] = (
    rx.ConnectionError,  # includes BusyLoadingError, AuthenticationError, MaxConnectionsError
    rx.TimeoutError,
    rx.ReadOnlyError,
    rx.OutOfMemoryError,
    rx.ClusterDownError,  # includes MasterDownError
    rx.TryAgainError,
    TimeoutError,  # our own bounds on blocking calls (asyncio.timeout)
    OSError,
)


@contextmanager
def unavailable_on_failure(operation: str) -> Iterator[None]:
    """Run the block; an availability failure leaves it as ``KeyValueStoreUnavailable``
    naming ``operation``, chained to the redis-py error."""
    try:
        yield
    except UNAVAILABLE as e:
        raise KeyValueStoreUnavailable(f"redis {operation}: {type(e).__name__}: {e}") from e
    except rx.RedisClusterException as e:
        # The cluster client wraps "no startup node reachable" (while it reads the slot map)
        # around the connection error; other cluster exceptions (a cross-slot call) are bugs.
        if not isinstance(e.__cause__, UNAVAILABLE):
            raise
        raise KeyValueStoreUnavailable(f"redis {operation}: {type(e).__name__}: {e}") from e

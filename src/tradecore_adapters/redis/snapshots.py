"""A small JSON document the processes share for a while: one key, read and written whole,
with a time to live (the metrics' system-wide queue counts, so that one scrape's scans serve
every process's scrapes until it lapses).

One key, so on a cluster it lives in one slot. Raises KeyValueStoreUnavailable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from tradecore_adapters.redis.client import Client, px_ms
from tradecore_adapters.redis.errors import unavailable_on_failure


class RedisSnapshot:
    """The document under ``key``: ``store`` replaces it for ``ttl_s``; ``load`` returns it,
    or None once it lapsed (or was never stored)."""

    def __init__(self, client: Client, key: str) -> None:
        self._client = client
        self._key = key

    async def load(self) -> dict[str, Any] | None:
        with unavailable_on_failure("shared snapshot"):
            raw = await self._client.get(self._key)
        if raw is None:
            return None
        document: dict[str, Any] = orjson.loads(raw)
        return document

    async def store(self, document: Mapping[str, Any], ttl_s: float) -> None:
        with unavailable_on_failure("shared snapshot"):
            await self._client.set(self._key, orjson.dumps(dict(document)), px=px_ms(ttl_s))

"""The outgoing HTTP session the bot-challenge verifier posts through."""

from __future__ import annotations

import aiohttp

REQUEST_TIMEOUT_S = 10.0


class SharedClientSession:
    """One ``aiohttp.ClientSession`` for the process, made on first call (inside the event
    loop, as aiohttp requires) and made again after it was closed; ``close`` is idempotent."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def __call__(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

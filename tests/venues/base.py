"""What every local venue shares: a server on 127.0.0.1 with a free port, a request log, and
faults a test schedules on the next matching requests.

A fault applies to the next ``times`` requests whose method and path match:

* ``Refuse``: answer with the given status, JSON body and headers without touching the venue's
  state (a 429, a 418, a 5xx, a maintenance answer);
* ``Delay``: wait ``seconds`` before handling (a slow venue; a client with a shorter timeout
  gives up while the request is still in flight);
* ``LoseAnswer``: handle the request (the venue's state changes, an order is accepted) and then
  close the connection without an answer, as when a connection drops after the venue acted;
* ``Hold``: handle the request (the venue acts), set the fault's ``accepted`` event and keep
  the answer back until the test sets ``release`` (never, if it does not): the moment after a
  venue took an order and before its client heard of it, e.g. to kill the client then.
  ``close`` releases every held answer, so a server never waits on one to shut down.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

import attrs
from aiohttp import web


@attrs.frozen
class Refuse:
    status: int
    body: Any
    headers: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen
class Delay:
    seconds: float


@attrs.frozen
class LoseAnswer:
    pass


@attrs.frozen(eq=False)
class Hold:
    """``accepted`` is set once the venue handled a held request; its answer leaves only
    after ``release`` is set. One ``Hold`` scheduled ``times`` > 1 holds every match until
    the one ``release``."""

    accepted: asyncio.Event = attrs.field(factory=asyncio.Event)
    release: asyncio.Event = attrs.field(factory=asyncio.Event)


Fault = Refuse | Delay | LoseAnswer | Hold


@attrs.define
class _Scheduled:
    method: str
    path: re.Pattern[str]
    fault: Fault
    times: int


class LocalVenue:
    """Base of the emulators: subclasses add their routes to ``self.app`` in ``__init__``."""

    def __init__(self) -> None:
        self.app = web.Application(middlewares=[self._faults_middleware])
        self.requests: list[tuple[str, str]] = []
        self._faults: list[_Scheduled] = []
        self._holds: list[Hold] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:<port>``: what a client's base URL is replaced with."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server: Any = site._server
        self.port = server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        for hold in self._holds:
            hold.release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> LocalVenue:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def fault(self, method: str, path: str, fault: Fault, *, times: int = 1) -> None:
        """Apply ``fault`` to the next ``times`` requests of ``method`` (``*`` for any) whose
        path fully matches the regular expression ``path``."""
        self._faults.append(_Scheduled(method.upper(), re.compile(path), fault, times))

    def count(self, method: str, path: str) -> int:
        """How many requests of ``method`` to exactly ``path`` arrived (faulted ones included)."""
        return sum(1 for m, p in self.requests if m == method.upper() and p == path)

    def _take(self, method: str, path: str) -> Fault | None:
        for scheduled in self._faults:
            if scheduled.method in ("*", method) and scheduled.path.fullmatch(path):
                scheduled.times -= 1
                if scheduled.times <= 0:
                    self._faults.remove(scheduled)
                return scheduled.fault
        return None

    @web.middleware
    async def _faults_middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        fault = self._take(request.method, request.path)
        if isinstance(fault, Refuse):
            return web.Response(
                status=fault.status,
                text=json.dumps(fault.body),
                content_type="application/json",
                headers=fault.headers,
            )
        if isinstance(fault, Delay):
            await request.read()  # a slow venue has the request: the client may give up now
            await asyncio.sleep(fault.seconds)
        response = await handler(request)
        if isinstance(fault, Hold):
            self._holds.append(fault)
            fault.accepted.set()  # the venue acted; the client waits for the answer
            await fault.release.wait()
        if isinstance(fault, LoseAnswer):
            if request.transport is not None:
                request.transport.close()
            raise asyncio.CancelledError  # the handler acted; the client never hears of it
        return response


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON answer with the given status (venues answer errors as JSON too)."""
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/json", headers=headers
    )


@attrs.frozen
class PlacedOrder:
    """An order a venue accepted, as a test sees it (the venue's own symbol id)."""

    client_order_id: str
    symbol: str
    side: str  # "buy" | "sell"
    quantity: Decimal
    filled: Decimal
    reduce_only: bool
    status: str  # the venue's own status word

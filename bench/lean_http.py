"""A lean HTTP/1.1 client for the load generator (``webhook_load.py --client lean``).

Raw HTTP/1.1 over keep-alive TCP connections (asyncio Protocols), one request at a time on
each (no pipelining); the caller hands over a request's bytes built in one piece and gets the
status and body of a response framed by Content-Length. A lost or broken connection, a
response nobody asked for, or one this client cannot frame is an error, and the next request
opens a new connection. It costs a fraction of aiohttp's client, so the load generator adds
little to what it measures (bench/README.md).
"""

from __future__ import annotations

import asyncio
import time
from typing import NamedTuple, cast

MAX_RESPONSE_HEAD = 64 * 1024  # bytes of status line and headers before the client gives up


class ProtocolError(Exception):
    """The server sent bytes this client does not read as an HTTP/1.1 response framed by
    Content-Length (the server under test frames every response so)."""


class Response(NamedTuple):
    status: int
    body: bytes
    keep_alive: bool  # false when the server said it closes the connection


def parse_head(head: bytes) -> tuple[int, int, bool]:
    """(status, Content-Length, keep-alive) of a status line and header block (without the
    blank line that ends it). Only the headers that frame the response are read. Raises
    ProtocolError on a malformed status line, a missing or malformed Content-Length, or a
    Transfer-Encoding."""
    line_end = head.find(b"\r\n")
    status_line = head if line_end < 0 else head[:line_end]
    version, _, rest = status_line.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or not rest[:3].isdigit():
        raise ProtocolError(f"bad status line {status_line[:80]!r}")
    # Every header line starts with CRLF here and ends with one.
    headers = b"" if line_end < 0 else head[line_end:].lower() + b"\r\n"
    if b"\r\ntransfer-encoding:" in headers:
        raise ProtocolError("unexpected Transfer-Encoding")
    length = header_value(headers, b"content-length")
    if length is None or not length.isdigit():
        raise ProtocolError(f"no valid Content-Length ({length!r})")
    connection = header_value(headers, b"connection")
    keep_alive = version == b"HTTP/1.1" if connection is None else connection != b"close"
    return int(rest[:3]), int(length), keep_alive


def header_value(headers: bytes, name: bytes) -> bytes | None:
    """The value of the first header ``name`` in lower-cased header lines that each start
    and end with CRLF, without surrounding whitespace; None when there is none."""
    start = headers.find(b"\r\n" + name + b":")
    if start < 0:
        return None
    start += len(name) + 3
    return headers[start : headers.find(b"\r\n", start)].strip()


class ResponseParser:
    """Splits the bytes of one connection into responses. ``feed`` takes whatever arrived
    (part of a response, exactly one, or several) and returns the responses it completed, in
    order; an incomplete rest waits for the next call. Raises ProtocolError (see
    ``parse_head``, or a head over MAX_RESPONSE_HEAD bytes); the parser is then unusable."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._head: tuple[int, int, bool] | None = None  # of the response whose body is due

    def feed(self, data: bytes) -> list[Response]:
        self._buffer += data
        responses: list[Response] = []
        while True:
            if self._head is None:
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buffer) > MAX_RESPONSE_HEAD:
                        raise ProtocolError("response head too long")
                    return responses
                self._head = parse_head(bytes(self._buffer[:end]))
                del self._buffer[: end + 4]
            status, length, keep_alive = self._head
            if len(self._buffer) < length:
                return responses
            responses.append(Response(status, bytes(self._buffer[:length]), keep_alive))
            del self._buffer[:length]
            self._head = None


class HttpConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection that carries one request at a time (no pipelining).

    ``exchange(request)`` writes a complete request and returns a future of (response,
    ``perf_counter()`` when its last byte arrived). The future fails with OSError when the
    connection is lost first (ConnectionResetError when the server closed it), ProtocolError
    on bytes that are not the one expected response, TimeoutError after ``time_out()``; each
    of these closes the connection.
    ``reusable`` is false from then on, and once the server said it will close. ``sent_at``
    is the ``perf_counter()`` of the pending request's write, None when none is pending."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._parser = ResponseParser()
        self._waiter: asyncio.Future[tuple[Response, float]] | None = None
        self.reusable = True
        self.sent_at: float | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def exchange(self, request: bytes) -> asyncio.Future[tuple[Response, float]]:
        assert self._transport is not None and self._waiter is None and self.reusable
        waiter: asyncio.Future[tuple[Response, float]] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self.sent_at = time.perf_counter()
        self._transport.write(request)
        return waiter

    def data_received(self, data: bytes) -> None:
        arrived = time.perf_counter()
        try:
            responses = self._parser.feed(data)
        except ProtocolError as e:
            self._fail(e)
            return
        for response in responses:
            waiter, self._waiter, self.sent_at = self._waiter, None, None
            if waiter is None:
                self._fail(ProtocolError("a response to no request"))
                return
            if not waiter.done():
                waiter.set_result((response, arrived))
            if not response.keep_alive:
                self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._fail(exc if isinstance(exc, OSError) else ConnectionResetError("closed by server"))

    def time_out(self) -> None:
        self._fail(TimeoutError("no complete response in time"))

    def close(self) -> None:
        self.reusable = False
        if self._transport is not None:
            self._transport.close()

    def _fail(self, error: Exception) -> None:
        waiter, self._waiter, self.sent_at = self._waiter, None, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        if self.reusable:
            self.reusable = False
            assert self._transport is not None
            self._transport.abort()


class LeanClient:
    """Keep-alive connections to one server, at most ``limit`` of them, each carrying one
    request at a time; a request waits for a free connection when all are busy. A connection
    that failed or that the server closes is dropped; the next request opens a fresh one.
    Connecting fails after ``timeout`` seconds, an exchange between ``timeout`` and
    ``timeout`` plus a tenth of it (at most 1 s) after its write: one periodic check for all
    connections instead of a timer per request (as wrk does). Construct it inside the
    running loop; ``close`` ends it."""

    def __init__(self, host: str, port: int, limit: int, timeout: float) -> None:
        self._host, self._port, self._timeout = host, port, timeout
        self._slots = asyncio.Semaphore(limit)
        self._idle: list[HttpConnection] = []
        self._open: set[HttpConnection] = set()
        self._check_every = min(1.0, timeout / 10)
        self._watchdog = asyncio.get_running_loop().call_later(self._check_every, self._watch)

    async def exchange(self, request: bytes) -> tuple[Response, float]:
        """Send one complete request; (response, ``perf_counter()`` at its last byte)."""
        async with self._slots:
            connection = await self._connection()
            answer = await connection.exchange(request)
            if connection.reusable:
                self._idle.append(connection)
            return answer

    async def _connection(self) -> HttpConnection:
        while self._idle:
            connection = self._idle.pop()  # the most recently used: few connections stay hot
            if connection.reusable:
                return connection
        async with asyncio.timeout(self._timeout):
            _, connection = await asyncio.get_running_loop().create_connection(
                HttpConnection, self._host, self._port
            )
        self._open.add(connection)
        return connection

    def _watch(self) -> None:
        """Time out the exchanges written more than ``timeout`` ago; forget closed
        connections."""
        written_before = time.perf_counter() - self._timeout
        for connection in list(self._open):
            if not connection.reusable:
                self._open.discard(connection)
            elif connection.sent_at is not None and connection.sent_at < written_before:
                connection.time_out()
        self._watchdog = asyncio.get_running_loop().call_later(self._check_every, self._watch)

    def close(self) -> None:
        self._watchdog.cancel()
        for connection in self._idle:
            connection.close()
        self._idle.clear()

"""The API <-> worker bus on Redis: the order queue and the worker directory.

Keys (specification, "Internal messages", plus auxiliaries under the same prefixes):

* ``worker:active:{user_id}`` - the active mark: the lease ``"{holder}:{token}"``, a string
  with a PX time to live;
* ``worker:fence:{user_id}`` - the user's fencing-token counter (INCR in the acquiring
  script; no TTL, so tokens never go back while the data set lives);
* ``trading:user:{user_id}:requests`` - the request list (RPUSH by the API, oldest at the left);
* ``trading:user:{user_id}:processing`` - the in-flight list: ``take`` moves a request there
  with LMOVE and only ``complete`` removes it, so a worker crash loses nothing;
* ``trading:response:{request_id}`` - the reply list, one entry, expiring after 60 s;
* ``trading:replies:{process}`` - a waiting process's reply channel: ``complete`` publishes
  the request id there (the request's ``reply_to``) in the same script that writes the reply;
* ``worker-control.fifo`` - the start-request list, and ``worker-control.fifo:pending`` the
  set that deduplicates it while a user's request is pending.

Pushes publish the user id on the channel ``trading:user:requests:pushed`` in the same script,
which wakes the user's waiting ``take`` in whichever host serves it: an idle worker holds no
connection, so a host runs thousands of them on a handful of sockets. Replies go the same way
back: each queue instance (one per API process) listens on its own reply channel with one
connection, whatever the number of requests waiting, and the reply list stays the durable
record that a waiter reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Mapping

import attrs
from redis.asyncio import Redis

from tradecore.orders import OrderRequest, OrderResult
from tradecore.ports.messaging import QueueDepth, WorkerLease
from tradecore_adapters.redis.client import RedisConnections, Wakeups, text
from tradecore_adapters.redis.codec import (
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from tradecore_adapters.redis.errors import unavailable_on_failure

REPLY_TTL_S = 60.0
"""A reply nobody collected is dropped after this long (the API waits at most 30 s)."""

PUSHED_CHANNEL = "trading:user:requests:pushed"
REPLY_CHANNEL_PREFIX = "trading:replies:"
CONTROL_KEY = "worker-control.fifo"
CONTROL_PENDING_KEY = "worker-control.fifo:pending"

_RECHECK_S = 30.0
"""Longest wait of ``take`` without looking at the list. A wake-up is lost only while the
listener reconnects, and every watcher is woken when it has (``Wakeups``); this bounds the
wait should that ever fail, without making thousands of idle workers poll."""
_MIN_BLOCK_S = 0.01
"""Shortest server-side block: Redis reads a block under 1 ms as 0, which means forever."""
_ACTIVE_POLL_FIRST_S = 0.001
_ACTIVE_POLL_CAP_S = 0.02


def mark_key(user_id: str) -> str:
    return f"worker:active:{user_id}"


def fence_key(user_id: str) -> str:
    return f"worker:fence:{user_id}"


def requests_key(user_id: str) -> str:
    return f"trading:user:{user_id}:requests"


def processing_key(user_id: str) -> str:
    return f"trading:user:{user_id}:processing"


def response_key(request_id: str) -> str:
    return f"trading:response:{request_id}"


# KEYS: mark, requests. ARGV: payload, channel, user id. Push only while the mark exists.
_PUSH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""

# KEYS: request list. ARGV: request payload, wake-up channel, user id. Append whatever the mark
# (an order parked while no worker runs; the orphan sweep finds the list) and wake the worker.
_PARK = """
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""

# KEYS: reply, in-flight list. ARGV: result payload, reply ttl in ms, request payload, request
# id. Replace the reply (a list of one), set its TTL, drop the request from the in-flight list,
# and publish the request id on the request's reply channel, if it names one. The codec writes
# reply_to last: an addressed payload is the bare one with ',"reply_to":"..."' before its
# closing brace (a quote inside a JSON string is escaped, so no other field can end that way).
# The in-flight entry is found by its text; failing that (the caller's copy and the entry
# differ in their address only), by its bare text, with or without an address.
_COMPLETE = """
redis.call('DEL', KEYS[1])
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local suffix = ',"reply_to":"([^"]*)"}$'
local channel = string.match(ARGV[3], suffix)
if redis.call('LREM', KEYS[2], 1, ARGV[3]) == 0 then
  local bare = string.gsub(ARGV[3], suffix, '}')
  local stem = string.sub(bare, 1, -2)
  for _, entry in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
    local address = string.sub(entry, 1, #stem) == stem
      and string.match(string.sub(entry, #stem + 1), '^' .. suffix)
    if entry == bare or address then
      redis.call('LREM', KEYS[2], 1, entry)
      channel = channel or address or nil
      break
    end
  end
end
if channel then redis.call('PUBLISH', channel, ARGV[4]) end
return 1
"""

# A lease is the mark's value "{holder}:{token}"; the token is the digits after the last colon
# (a holder name may contain colons). Each script reads the current lease with this prelude;
# a mark that is not a lease (no token) is nobody's to change, and nobody's to take.
_READ_LEASE = """
local current = redis.call('GET', KEYS[1])
local holder, token = string.match(current or '', '^(.*):(%d+)$')
"""

# KEYS: mark, fence. ARGV: holder, ttl in ms. A new lease with the next fencing token when
# there is none; the same holder's lease refreshed; nil when another holder has it.
_ACQUIRE = (
    _READ_LEASE
    + """
if current then
  if holder ~= ARGV[1] then return false end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(token)
end
token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. token, 'PX', ARGV[2])
return token
"""
)

# KEYS: mark. ARGV: token, ttl in ms. Extend the lease only while it carries the token.
_RENEW = (
    _READ_LEASE
    + """
if token ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
)

# KEYS: marks. ARGV: ttl in ms, then one token per mark. _RENEW for each mark; returns one
# 1 (renewed) or 0 per mark, in order.
_RENEW_MANY = """
local renewed = {}
for i, key in ipairs(KEYS) do
  local current = redis.call('GET', key)
  local holder, token = string.match(current or '', '^(.*):(%d+)$')
  if token == ARGV[i + 1] then
    redis.call('PEXPIRE', key, ARGV[1])
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
"""
_RENEW_BATCH = 200
"""Leases renewed by one script call (a call blocks the server for its length)."""

# KEYS: mark. ARGV: token. Delete the lease only while it carries the token.
_RELEASE = (
    _READ_LEASE
    + """
if token ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""
)

# KEYS: mark, requests. ARGV: token. Delete the lease only while it carries the token and
# no request waits.
_RETIRE = (
    _READ_LEASE
    + """
if token ~= ARGV[1] or redis.call('LLEN', KEYS[2]) > 0 then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""
)

# KEYS: control list, pending set. ARGV: user id. The set says "pending"; a user the set
# names but the list lacks (a host took it and died before clearing the set) is pushed again.
_REQUEST_START = """
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 or not redis.call('LPOS', KEYS[1], ARGV[1]) then
  redis.call('RPUSH', KEYS[1], ARGV[1])
  return 1
end
return 0
"""

# KEYS: control list, pending set. ARGV: the user id just popped (or '' to pop here).
# Clear the pending entry unless the user was requested again meanwhile.
_SETTLE_START = """
local user = ARGV[1]
if user == '' then
  user = redis.call('LPOP', KEYS[1])
  if not user then return false end
end
if not redis.call('LPOS', KEYS[1], user) then redis.call('SREM', KEYS[2], user) end
return user
"""


class RedisOrderQueue:
    """OrderQueue on Redis (keys in the module docstring).

    ``push`` and ``park`` address a request without ``reply_to`` to this instance's reply
    channel; ``push`` appends only while the user's mark exists, in one script; ``take``
    moves the oldest request to the in-flight list (LMOVE) and waits for a push through
    ``Wakeups`` without holding a connection; ``complete`` replaces the reply, sets its TTL,
    drops the request from the in-flight list and publishes the request id on its
    ``reply_to`` channel in one script (one round trip, atomic); ``wait_result`` watches its
    request id on the reply channel (``replies``, one connection for every waiter), then
    pops the reply list once, again at each notification or reconnection of the listener,
    and once more at its timeout: a lost notification delays a reply to the timeout, never
    loses it. Raises KeyValueStoreUnavailable.
    """

    def __init__(
        self,
        connections: RedisConnections,
        wakeups: Wakeups | None = None,
        replies: Wakeups | None = None,
    ) -> None:
        self._client = connections.commands
        self._wakeups = wakeups or Wakeups(connections.commands, PUSHED_CHANNEL)
        self._replies = replies or Wakeups(
            connections.commands, REPLY_CHANNEL_PREFIX + uuid.uuid4().hex
        )
        self._push = self._client.register_script(_PUSH)
        self._park = self._client.register_script(_PARK)
        self._complete = self._client.register_script(_COMPLETE)

    async def aclose(self) -> None:
        """Stop listening for pushes and replies (the clients stay open: their owner closes
        them); a reply still awaited is looked for once more and found closed."""
        await self._wakeups.aclose()
        await self._replies.aclose()

    async def push(self, request: OrderRequest) -> bool:
        user = request.user_id
        with unavailable_on_failure("push"):
            pushed = await self._push(
                keys=[mark_key(user), requests_key(user)],
                args=[encode_request(self._addressed(request)), self._wakeups.channel, user],
            )
        return bool(int(pushed))

    async def park(self, request: OrderRequest) -> None:
        user = request.user_id
        with unavailable_on_failure("park"):
            await self._park(
                keys=[requests_key(user)],
                args=[encode_request(self._addressed(request)), self._wakeups.channel, user],
            )

    async def wait_result(self, request_id: str, timeout_s: float) -> OrderResult | None:
        if timeout_s <= 0:
            return await self._pop_reply(request_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        # Watch before the first look, so a reply published after the look still wakes us.
        event = self._replies.watch(request_id)
        try:
            while True:
                event.clear()
                result = await self._pop_reply(request_id)
                if result is not None:
                    return result
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await event.wait()
        finally:
            self._replies.unwatch(request_id, event)

    @property
    def waiting_replies(self) -> int:
        """Request ids with a ``wait_result`` in progress in this process."""
        return self._replies.watched

    async def take(self, user_id: str, timeout_s: float) -> OrderRequest | None:
        if timeout_s <= 0:
            return await self._move_oldest(user_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        event = self._wakeups.watch(user_id)
        try:
            while True:
                # Clear before looking, so a push after the look still wakes the wait.
                event.clear()
                request = await self._move_oldest(user_id)
                if request is not None:
                    return request
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, _RECHECK_S)):
                        await event.wait()
                if not event.is_set() and deadline - loop.time() <= 0:
                    return None
        finally:
            self._wakeups.unwatch(user_id, event)

    async def complete(self, request: OrderRequest, result: OrderResult) -> None:
        with unavailable_on_failure("complete"):
            await self._complete(
                keys=[response_key(request.request_id), processing_key(request.user_id)],
                args=[
                    encode_result(result),
                    _ms(REPLY_TTL_S),
                    encode_request(request),
                    request.request_id,
                ],
            )

    async def in_flight(self, user_id: str) -> list[OrderRequest]:
        with unavailable_on_failure("in-flight list"):
            raws = await self._client.lrange(processing_key(user_id), 0, -1)
        return [decode_request(raw) for raw in raws]

    async def depths(self, limit: int = 1000) -> list[QueueDepth]:
        """SCAN the request and in-flight lists (an operator's read, not a hot path), then
        read their lengths in one pipeline; empty lists do not exist in Redis."""
        users: set[str] = set()
        with unavailable_on_failure("queue depths"):
            async for raw in self._client.scan_iter(match="trading:user:*", count=500):
                key = text(raw)
                for suffix in (":requests", ":processing"):
                    if key.endswith(suffix):
                        users.add(key[len("trading:user:") : -len(suffix)])
            chosen = sorted(users)[: max(0, limit)]
            pipe = self._client.pipeline(transaction=False)
            for user_id in chosen:
                pipe.llen(requests_key(user_id))
                pipe.llen(processing_key(user_id))
            lengths = [int(n) for n in await pipe.execute()] if chosen else []
        depths = (QueueDepth(u, lengths[2 * i], lengths[2 * i + 1]) for i, u in enumerate(chosen))
        return [d for d in depths if d.waiting or d.in_flight]

    def _addressed(self, request: OrderRequest) -> OrderRequest:
        """``request`` with this instance's reply channel unless it already names one (a
        request handed over again keeps its waiter's address)."""
        if request.reply_to is not None:
            return request
        return attrs.evolve(request, reply_to=self._replies.channel)

    async def _pop_reply(self, request_id: str) -> OrderResult | None:
        with unavailable_on_failure("wait for a reply"):
            raw: str | bytes | None = await self._client.lpop(  # type: ignore[assignment]
                response_key(request_id)
            )  # one element: LPOP without a count
        return None if raw is None else decode_result(raw)

    async def _move_oldest(self, user_id: str) -> OrderRequest | None:
        with unavailable_on_failure("take"):
            raw = await self._client.lmove(
                requests_key(user_id), processing_key(user_id), "LEFT", "RIGHT"
            )
        return None if raw is None else decode_request(raw)


class RedisWorkerDirectory:
    """WorkerDirectory on Redis (keys in the module docstring).

    ``acquire`` (with the INCR of the fencing token), ``renew``, ``release`` and ``retire``
    are each one script (``renew_many``: one script per 200 leases), so a lease is compared
    and changed in one step; ``request_start`` is deduplicated while the user's start request
    is pending; ``next_start_request`` is a blocking pop bounded by its timeout;
    ``wait_active`` polls the mark with a short backoff (1 ms doubling to 20 ms), so a cold
    start is seen within milliseconds. Times to live are
    the server's (PX, whole milliseconds, at least 1). Raises KeyValueStoreUnavailable.
    """

    def __init__(self, connections: RedisConnections) -> None:
        self._client: Redis = connections.commands
        self._blocking: Redis = connections.blocking
        self._grace_s = connections.grace_s
        self._acquire = self._client.register_script(_ACQUIRE)
        self._renew = self._client.register_script(_RENEW)
        self._renew_many = self._client.register_script(_RENEW_MANY)
        self._release = self._client.register_script(_RELEASE)
        self._retire = self._client.register_script(_RETIRE)
        self._request_start = self._client.register_script(_REQUEST_START)
        self._settle_start = self._client.register_script(_SETTLE_START)

    async def is_active(self, user_id: str) -> bool:
        with unavailable_on_failure("active mark"):
            return bool(await self._client.exists(mark_key(user_id)))

    async def orphaned_users(self, limit: int = 100) -> list[str]:
        """SCAN the request and in-flight lists (a sweep, not a hot path) for users whose
        list is non-empty and whose mark is absent."""
        found: list[str] = []
        with unavailable_on_failure("orphan sweep"):
            async for raw in self._client.scan_iter(match="trading:user:*", count=500):
                key = text(raw)
                for suffix in (":requests", ":processing"):
                    if not key.endswith(suffix):
                        continue
                    user_id = key[len("trading:user:") : -len(suffix)]
                    if user_id in found or await self._client.exists(mark_key(user_id)):
                        continue
                    if await self._client.llen(key):
                        found.append(user_id)
                if len(found) >= limit:
                    break
        return found

    async def request_start(self, user_id: str) -> None:
        with unavailable_on_failure("start request"):
            await self._request_start(keys=[CONTROL_KEY, CONTROL_PENDING_KEY], args=[user_id])

    async def wait_active(self, user_id: str, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        pause = _ACTIVE_POLL_FIRST_S
        while True:
            if await self.is_active(user_id):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            await asyncio.sleep(min(pause, remaining))
            pause = min(pause * 2, _ACTIVE_POLL_CAP_S)

    async def next_start_request(self, timeout_s: float) -> str | None:
        keys = [CONTROL_KEY, CONTROL_PENDING_KEY]
        with unavailable_on_failure("next start request"):
            if timeout_s <= 0:
                user = await self._settle_start(keys=keys, args=[""])
                return None if user is None else text(user)
            block_s = max(timeout_s, _MIN_BLOCK_S)
            async with asyncio.timeout(block_s + self._grace_s):
                popped = await self._blocking.blpop([CONTROL_KEY], timeout=block_s)
            if popped is None:
                return None
            user = text(popped[1])
            await self._settle_start(keys=keys, args=[user])
            return user

    async def acquire(self, user_id: str, holder: str, ttl_s: float) -> int | None:
        with unavailable_on_failure("acquire lease"):
            token = await self._acquire(
                keys=[mark_key(user_id), fence_key(user_id)], args=[holder, _ms(ttl_s)]
            )
        return None if token is None else int(token)

    async def renew(self, user_id: str, token: int, ttl_s: float) -> bool:
        with unavailable_on_failure("renew lease"):
            renewed = await self._renew(keys=[mark_key(user_id)], args=[token, _ms(ttl_s)])
        return bool(int(renewed))

    async def renew_many(self, leases: Mapping[str, int], ttl_s: float) -> set[str]:
        users = list(leases)
        lost: set[str] = set()
        with unavailable_on_failure("renew leases"):
            for start in range(0, len(users), _RENEW_BATCH):
                batch = users[start : start + _RENEW_BATCH]
                renewed = await self._renew_many(
                    keys=[mark_key(u) for u in batch],
                    args=[_ms(ttl_s), *(leases[u] for u in batch)],
                )
                lost.update(u for u, ok in zip(batch, renewed, strict=True) if not int(ok))
        return lost

    async def release(self, user_id: str, token: int) -> None:
        with unavailable_on_failure("release lease"):
            await self._release(keys=[mark_key(user_id)], args=[token])

    async def leases(self, limit: int = 1000) -> list[WorkerLease]:
        """SCAN the marks (an operator's read, not a hot path), then read them with MGET; a
        mark that expired in between is left out, as is a value that is not a lease."""
        prefix = mark_key("")
        with unavailable_on_failure("leases"):
            keys = sorted(
                {text(raw) async for raw in self._client.scan_iter(match=prefix + "*", count=500)}
            )[: max(0, limit)]
            values = await self._client.mget(keys) if keys else []
        found: list[WorkerLease] = []
        for key, value in zip(keys, values, strict=True):
            holder, _, token = text(value).rpartition(":") if value is not None else ("", "", "")
            if holder and token.isdigit():
                found.append(WorkerLease(key[len(prefix) :], holder, int(token)))
        return found

    async def retire(self, user_id: str, token: int) -> bool:
        with unavailable_on_failure("retire"):
            retired = await self._retire(
                keys=[mark_key(user_id), requests_key(user_id)], args=[token]
            )
        return bool(int(retired))


def _ms(seconds: float) -> int:
    """A PX time to live: whole milliseconds, at least 1 (Redis refuses 0)."""
    return max(1, round(seconds * 1000))

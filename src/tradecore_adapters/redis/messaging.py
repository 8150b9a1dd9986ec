"""The API <-> worker bus on Redis: the order queue and the worker directory.

Keys (specification, "Internal messages", plus auxiliaries under the same prefixes). Every
key of one user carries the user id as its hash tag (``keys``), so each script below touches
one Redis Cluster slot; the braces are part of the names on a single server too:

* ``worker:active:{user_id}`` - the active mark: the lease ``"{holder}:{token}"``, a string
  with a PX time to live;
* ``worker:fence:{user_id}`` - the user's fencing-token counter (INCR in the acquiring
  script; no TTL, so tokens never go back while the data set lives);
* ``trading:user:{user_id}:requests`` - the request list (RPUSH by the API, oldest at the left);
* ``trading:user:{user_id}:processing`` - the in-flight list: ``take`` moves a request there
  with LMOVE and only ``complete`` removes it, so a worker crash loses nothing;
* ``trading:user:{user_id}:handed`` - the hand-over: ``"{request_id} {payload}"`` of a request
  the push put straight in the in-flight list (nothing waited or was in flight) and no take
  has returned yet. Until then the request counts as waiting: ``take`` returns it first,
  ``in_flight`` leaves it out, ``retire`` refuses while the key exists, and ``complete`` of
  that request deletes it (a take that had it from the push's wake-up leaves the key);
* ``trading:response:{user_id}:{request_id}`` - the reply list, one entry, expiring after
  60 s; in the user's slot because ``complete`` writes it together with the in-flight list;
* ``trading:replies:{process}`` - a waiting process's reply channel: ``complete`` publishes
  ``"{request_id} {reply}"`` there (the request's ``reply_to``) in the same script that
  writes the reply, so the waiter needs no read of the reply list (``replies``);
* ``worker:hosts`` - the worker hosts' records (``RedisWorkerDirectory.host_alive``): a sorted
  set of holder names scored by when each record runs out; one key, so on a cluster it lives
  in one slot and its scripts touch that slot only;
* ``worker-control.fifo:{sNN}`` - shard NN of the start-request list (a user's requests go to
  shard ``crc32(user_id) % shards``), and ``worker-control.fifo:{sNN}:pending`` the set that
  deduplicates it while a user's request is pending.

Pushes publish the user id on the channel ``trading:user:requests:pushed`` in the same script,
which wakes the user's waiting ``take`` in whichever host serves it: an idle worker holds no
connection, so a host runs thousands of them on a handful of sockets. A push that hands its
request over publishes ``"{user_id} {payload}"`` instead, and the waiting take returns that
payload without a round trip of its own (``Wakeups``' carried values); a take that missed the
notification finds the hand-over key. Start requests publish
their shard on ``worker-control.fifo:wakeups`` the same way, so a worker host waiting for one
holds no connection either and looks at the shards (starting at a rotating one) only when
woken. Replies go the same way back: each queue instance (one per API process) listens on its
own reply channel with one connection, whatever the number of requests waiting; the
notification carries the reply, and the reply list stays the durable record that a waiter
reads when it may have missed one (``ReplyInbox``). The channels are classic pub/sub: on a
cluster a PUBLISH, a script's included, reaches the subscribers of every node.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping

import attrs
from redis.crc import key_slot

from tradecore.orders import OrderRequest, OrderResult
from tradecore.ports.messaging import QueueDepth, WorkerLease
from tradecore_adapters.redis.batching import shared_batcher
from tradecore_adapters.redis.client import (
    Client,
    RedisConnections,
    Wakeups,
    Watch,
    px_ms,
    text,
)
from tradecore_adapters.redis.codec import (
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from tradecore_adapters.redis.errors import unavailable_on_failure
from tradecore_adapters.redis.keys import shard_of, shard_tag, tagged
from tradecore_adapters.redis.replies import ReplyInbox

REPLY_TTL_S = 60.0
"""A reply nobody collected is dropped after this long (the API waits at most 30 s)."""

PUSHED_CHANNEL = "trading:user:requests:pushed"
REPLY_CHANNEL_PREFIX = "trading:replies:"
CONTROL_PREFIX = "worker-control.fifo"
CONTROL_CHANNEL = "worker-control.fifo:wakeups"

_RECHECK_S = 30.0
"""Longest wait of ``take`` without looking at the list. A wake-up is lost only while the
listener reconnects, and every watcher is woken when it has (``Wakeups``); this bounds the
wait should that ever fail, without making thousands of idle workers poll."""
_FOUND_EMPTY_KEPT = 10_000
"""Most users whose next take may skip its first look (``RedisOrderQueue.complete``); a
user beyond it only looks once more."""
_COMPLETED_KEPT = 4096
"""Request ids a queue remembers having completed, so a late hand-over wake-up is not taken."""
_START = "start"
"""The one wake-up name on the start-request channel."""
_ACTIVE_POLL_FIRST_S = 0.001
_ACTIVE_POLL_CAP_S = 0.02


MARK_PREFIX = "worker:active:"
HOSTS_KEY = "worker:hosts"
USER_PREFIX = "trading:user:"
_USER_LISTS = ("}:requests", "}:processing")


def mark_key(user_id: str) -> str:
    return MARK_PREFIX + tagged(user_id)


def fence_key(user_id: str) -> str:
    return "worker:fence:" + tagged(user_id)


def requests_key(user_id: str) -> str:
    return f"{USER_PREFIX}{tagged(user_id)}:requests"


def processing_key(user_id: str) -> str:
    return f"{USER_PREFIX}{tagged(user_id)}:processing"


def handed_key(user_id: str) -> str:
    return f"{USER_PREFIX}{tagged(user_id)}:handed"


def response_key(user_id: str, request_id: str) -> str:
    return f"trading:response:{tagged(user_id)}:{request_id}"


def control_keys(shard: int) -> tuple[str, str]:
    """The start-request list and pending set of ``shard``."""
    base = f"{CONTROL_PREFIX}:{shard_tag(shard)}"
    return base, base + ":pending"


def user_of_list(key: str) -> str | None:
    """The user id of a request or in-flight list's key; None for any other key."""
    if not key.startswith(USER_PREFIX + "{"):
        return None
    for suffix in _USER_LISTS:
        if key.endswith(suffix):
            return key[len(USER_PREFIX) + 1 : -len(suffix)] or None
    return None


# KEYS: mark, requests, in-flight list, hand-over. ARGV: payload, channel, user id, request id,
# "1" when the request may be handed over. Push only while the mark exists. When nothing waits
# and nothing is in flight (the user's worker is idle), hand the request over: straight into
# the in-flight list, the hand-over key naming it, and the payload in the wake-up, so the
# waiting take needs no round trip; otherwise append it and wake the worker (returns 2 or 1).
_PUSH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[5] == '1' and redis.call('LLEN', KEYS[2]) == 0 and redis.call('LLEN', KEYS[3]) == 0 then
  redis.call('RPUSH', KEYS[3], ARGV[1])
  redis.call('SET', KEYS[4], ARGV[4] .. ' ' .. ARGV[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3] .. ' ' .. ARGV[1])
  return 2
end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""

# The request payload in a hand-over key's value "{request id} {payload}" (a request id has no
# space); each script that reads the key defines it with this prelude.
_PAYLOAD_OF = """
local function payload_of(handed)
  return string.sub(handed, string.find(handed, ' ', 1, true) + 1)
end
"""

# KEYS: requests, in-flight list, hand-over. The request handed over, if one is (it is in the
# in-flight list already), else the oldest request moved to the in-flight list.
_TAKE = (
    _PAYLOAD_OF
    + """
local handed = redis.call('GETDEL', KEYS[3])
if handed then return payload_of(handed) end
return redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
"""
)

# KEYS: request list. ARGV: request payload, wake-up channel, user id. Append whatever the mark
# (an order parked while no worker runs; the orphan sweep finds the list) and wake the worker.
_PARK = """
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""

# KEYS: in-flight list, hand-over. The in-flight list without the request handed over that no
# take returned yet (it counts as waiting: the next take returns it).
_IN_FLIGHT = (
    _PAYLOAD_OF
    + """
local entries = redis.call('LRANGE', KEYS[1], 0, -1)
local handed = redis.call('GET', KEYS[2])
if not handed then return entries end
local payload = payload_of(handed)
local taken = {}
for _, entry in ipairs(entries) do
  if entry ~= payload then table.insert(taken, entry) end
end
return taken
"""
)

# KEYS: reply, in-flight list, request list, hand-over. ARGV: result payload, reply ttl in ms,
# request payload, request id. Replace the reply (a list of one), set its TTL, drop the request
# from the in-flight list and the hand-over key if it names this request (a take that had the
# request from the push's wake-up left it), publish
# "{request id} {result payload}" on the request's reply channel, if it names one, and return
# the number of requests waiting. The codec writes reply_to
# last: an addressed payload is the bare one with ',"reply_to":"..."' before its closing brace
# (a quote inside a JSON string is escaped, so no other field can end that way).
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
local handed = redis.call('GET', KEYS[4])
if handed and string.sub(handed, 1, #ARGV[4] + 1) == ARGV[4] .. ' ' then
  redis.call('DEL', KEYS[4])
end
if channel then redis.call('PUBLISH', channel, ARGV[4] .. ' ' .. ARGV[1]) end
return redis.call('LLEN', KEYS[3])
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
_RENEW_PARALLEL = 16
"""Renewal scripts in flight at once: on a cluster the marks spread over many slots, so a
host's renewals are many small scripts (a cluster pipeline cannot carry scripts)."""

# KEYS: mark. ARGV: token. Delete the lease only while it carries the token.
_RELEASE = (
    _READ_LEASE
    + """
if token ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""
)

# KEYS: mark, requests, hand-over. ARGV: token. Delete the lease only while it carries the
# token, no request waits and none was handed over that no take has returned.
_RETIRE = (
    _READ_LEASE
    + """
if token ~= ARGV[1] or redis.call('LLEN', KEYS[2]) > 0 or redis.call('EXISTS', KEYS[3]) == 1 then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
"""
)

# KEYS: control list, pending set (of the user's shard). ARGV: user id, wake-up channel,
# shard. The set says "pending"; a user the set names but the list lacks (a host took it and
# died before clearing the set) is pushed again. A push wakes the waiting worker hosts.
_REQUEST_START = """
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 or not redis.call('LPOS', KEYS[1], ARGV[1]) then
  redis.call('RPUSH', KEYS[1], ARGV[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
"""

# KEYS: control list, pending set (of one shard). Pop the oldest start request and clear
# its pending entry unless the user was requested again meanwhile.
_TAKE_START = """
local user = redis.call('LPOP', KEYS[1])
if not user then return false end
if not redis.call('LPOS', KEYS[1], user) then redis.call('SREM', KEYS[2], user) end
return user
"""

# The hosts' records (``host_alive``): one sorted set, member the holder, score the time (ms,
# the server's clock, read by this prelude) its record runs out.
_NOW_MS = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
"""

# KEYS: the set. ARGV: holder, ttl in ms.
_HOST_ALIVE = (
    _NOW_MS
    + """
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[1])
return 1
"""
)

# KEYS: the set. The records that ran out, removed in the same step (so each lapsed host is
# returned to one caller).
_LAPSED_HOSTS = (
    _NOW_MS
    + """
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ms)
if #lapsed > 0 then redis.call('ZREM', KEYS[1], unpack(lapsed)) end
return lapsed
"""
)


class RedisOrderQueue:
    """OrderQueue on Redis (keys in the module docstring).

    ``push`` and ``park`` address a request without ``reply_to`` to this instance's reply
    channel and remember its user for ``wait_result`` (the reply key is in the user's slot);
    ``push`` appends only while the user's mark exists, in one script; ``take`` moves the
    oldest request to the in-flight list (LMOVE) and waits for a push through
    ``Wakeups`` without holding a connection; ``complete`` replaces the reply, sets its TTL,
    drops the request from the in-flight list and publishes the request id with the reply on
    its ``reply_to`` channel in one script (one round trip, atomic); ``wait_result`` takes
    the reply from that notification (``ReplyInbox``, one connection for every waiter,
    its slot opened by the push while the listener is subscribed), and reads the reply list
    only when it may have missed it: a request pushed before the subscription or not pushed
    here, each reconnection of the listener, and its timeout.
    A lost notification delays a reply to the timeout, never loses it; the list lapses after
    ``REPLY_TTL_S``. ``wait_result`` knows only the requests pushed or parked through this instance
    (as the API process that hands an order over waits for it), for ``REPLY_TTL_S``, or
    given their user; for any other request id it answers None at once. Raises
    KeyValueStoreUnavailable.
    """

    def __init__(self, connections: RedisConnections, wakeups: Wakeups | None = None) -> None:
        self._client = connections.commands
        self._wakeups = wakeups or Wakeups(connections.commands, PUSHED_CHANNEL)
        self._replies = ReplyInbox(
            connections.commands, REPLY_CHANNEL_PREFIX + uuid.uuid4().hex, decode_result
        )
        self._push = self._client.register_script(_PUSH)
        self._park = self._client.register_script(_PARK)
        self._complete = self._client.register_script(_COMPLETE)
        self._take_next = self._client.register_script(_TAKE)
        self._in_flight = self._client.register_script(_IN_FLIGHT)
        # The hot path's calls (push, reply pop, take, complete) share pipelines with the
        # process's other concurrent calls (``batching``).
        self._batch = shared_batcher(self._client)
        # request id -> (user id, when the entry lapses), oldest first: whose reply key
        # ``wait_result`` reads. Pruned as requests are handed over, so bounded by the
        # requests of the last REPLY_TTL_S.
        # An OrderedDict, not a dict: the oldest entry is dropped on nearly every hand-over,
        # and a dict's first key is found by stepping over every slot deleted before it (16 us
        # a call with a minute of orders at 1,000/s, against 0.7 us here).
        self._handed_over: OrderedDict[str, tuple[str, float]] = OrderedDict()
        # user id -> the wake-up watcher ``complete`` registered when it found no request
        # waiting, for the user's next ``take`` (oldest first, at most _FOUND_EMPTY_KEPT:
        # a worker that stops after its last complete never takes it).
        self._found_empty: OrderedDict[str, Watch] = OrderedDict()
        # The request ids this instance completed lately (at most _COMPLETED_KEPT): a hand-over
        # whose wake-up comes late, after a take had found its key and the request was done, is
        # not taken again.
        self._completed: OrderedDict[str, None] = OrderedDict()

    async def aclose(self) -> None:
        """Stop listening for pushes and replies (the clients stay open: their owner closes
        them); a reply still awaited is looked for once more and found closed."""
        await self._wakeups.aclose()
        await self._replies.aclose()

    async def push(self, request: OrderRequest) -> bool:
        user = request.user_id

        # a hand-over's wake-up is "{user} {payload}": a user id with a space could not be read
        handing = "0" if " " in user else "1"

        async def send(payload: str) -> bool:
            with unavailable_on_failure("push"):
                pushed = await self._batch.script(
                    self._push,
                    [mark_key(user), requests_key(user), processing_key(user), handed_key(user)],
                    [payload, self._wakeups.channel, user, request.request_id, handing],
                )
            return bool(int(pushed))

        return await self._hand_over(request, send)

    async def park(self, request: OrderRequest) -> None:
        user = request.user_id

        async def send(payload: str) -> bool:
            with unavailable_on_failure("park"):
                await self._park(
                    keys=[requests_key(user)], args=[payload, self._wakeups.channel, user]
                )
            return True

        await self._hand_over(request, send)

    async def _hand_over(
        self, request: OrderRequest, send: Callable[[str], Awaitable[bool]]
    ) -> bool:
        """``send`` the request addressed to this instance (unless it names a waiter
        already), having opened its reply slot first (``ReplyInbox.expect``), so a reply
        published from then on is kept; whether it was handed over. A request handed over is
        remembered for ``wait_result``; the slot of one that was not is closed."""
        addressed = self._addressed(request)
        ours = addressed.reply_to == self._replies.channel
        if ours:
            self._replies.expect(request.request_id)
        handed_over = False
        try:
            handed_over = await send(encode_request(addressed))
        finally:
            if handed_over:
                self._remember(request)
            elif ours:
                self._replies.forget(request.request_id)
        return handed_over

    def _remember(self, request: OrderRequest) -> None:
        now = asyncio.get_running_loop().time()
        handed_over = self._handed_over
        # oldest first (insertion order): drop the lapsed ones from the front, without
        # copying the mapping (it holds a minute of orders)
        while handed_over:
            oldest = next(iter(handed_over))
            if handed_over[oldest][1] > now:
                break
            del handed_over[oldest]
            self._replies.forget(oldest)  # its reply was not awaited in time
        handed_over.pop(request.request_id, None)  # re-inserted last: newest
        handed_over[request.request_id] = (request.user_id, now + REPLY_TTL_S)

    async def wait_result(
        self, request_id: str, timeout_s: float, *, user_id: str | None = None
    ) -> OrderResult | None:
        """The port's ``wait_result``; ``user_id`` names the request's user when the request
        was not handed over through this instance (an operator's tool, a test)."""
        if user_id is None:
            known = self._handed_over.get(request_id)
            if known is None:
                return None
            user_id = known[0]
        return await self._wait_result(user_id, request_id, timeout_s)

    async def _wait_result(
        self, user_id: str, request_id: str, timeout_s: float
    ) -> OrderResult | None:
        async def look() -> OrderResult | None:
            return await self._pop_reply(user_id, request_id)

        return await self._replies.wait(request_id, look, timeout_s)

    @property
    def replies_subscribed(self) -> bool:
        """Whether this instance's reply listener is subscribed now (started by the first
        ``wait_result``): a request pushed from then on gets its reply from the notification,
        without a read of the reply list."""
        return self._replies.subscribed

    @property
    def waiting_replies(self) -> int:
        """Request ids with a ``wait_result`` in progress in this process."""
        return self._replies.waiting

    async def take(self, user_id: str, timeout_s: float) -> OrderRequest | None:
        """The port's ``take``: the request handed over at its push if there is one (from the
        push's wake-up when it comes while the take waits, with no round trip; else from the
        hand-over key), or the oldest waiting one moved to the in-flight list."""

        async def look() -> OrderRequest | None:
            return await self._move_oldest(user_id)

        return await self._wakeups.look_until(
            user_id,
            look,
            timeout_s,
            _RECHECK_S,
            look_at_deadline=False,
            watching=self._found_empty.pop(user_id, None),
            carried=self._handed_over_request,
        )

    def _handed_over_request(self, payload: str) -> OrderRequest | None:
        """The request a hand-over's wake-up carried, unless this instance completed it
        already (the wake-up came after a take had found the hand-over key)."""
        request = decode_request(payload)
        return None if request.request_id in self._completed else request

    async def complete(self, request: OrderRequest, result: OrderResult) -> None:
        """The port's ``complete``. The script also answers how many requests wait; when
        none does, the worker's next ``take`` waits for a push before its first look (a
        push after the script wakes the watcher registered before it was sent), instead of
        spending a round trip to find the list empty. Only where takes already listen for
        pushes (a worker host): a complete alone starts no listener."""
        user_id = request.user_id
        watcher = self._wakeups.watch(user_id) if self._wakeups.listening else None
        try:
            with unavailable_on_failure("complete"):
                waiting = await self._batch.script(
                    self._complete,
                    [
                        response_key(user_id, request.request_id),
                        processing_key(user_id),
                        requests_key(user_id),
                        handed_key(user_id),
                    ],
                    [
                        encode_result(result),
                        px_ms(REPLY_TTL_S),
                        encode_request(request),
                        request.request_id,
                    ],
                )
        except BaseException:
            if watcher is not None:
                self._wakeups.unwatch(user_id, watcher)
            raise
        completed = self._completed
        completed[request.request_id] = None
        while len(completed) > _COMPLETED_KEPT:
            completed.popitem(last=False)
        if watcher is None:
            return
        self._forget_found_empty(user_id)
        if int(waiting) > 0:
            self._wakeups.unwatch(user_id, watcher)
            return
        self._found_empty[user_id] = watcher
        while len(self._found_empty) > _FOUND_EMPTY_KEPT:  # workers that stopped after it
            self._forget_found_empty(next(iter(self._found_empty)))

    def _forget_found_empty(self, user_id: str) -> None:
        watcher = self._found_empty.pop(user_id, None)
        if watcher is not None:
            self._wakeups.unwatch(user_id, watcher)

    async def in_flight(self, user_id: str) -> list[OrderRequest]:
        with unavailable_on_failure("in-flight list"):
            raws = await self._in_flight(keys=[processing_key(user_id), handed_key(user_id)])
        return [decode_request(raw) for raw in raws]

    async def depths(self, limit: int = 1000) -> list[QueueDepth]:
        """SCAN the request and in-flight lists (an operator's read, not a hot path), then
        read their lengths in one pipeline; empty lists do not exist in Redis."""
        users: set[str] = set()
        with unavailable_on_failure("queue depths"):
            async for raw in self._client.scan_iter(match=USER_PREFIX + "{*", count=500):
                user_id = user_of_list(text(raw))
                if user_id is not None:
                    users.add(user_id)
            chosen = sorted(users)[: max(0, limit)]
            pipe = self._client.pipeline(transaction=False)
            for user_id in chosen:
                pipe.llen(requests_key(user_id))
                pipe.llen(processing_key(user_id))
                pipe.exists(handed_key(user_id))
            counts = [int(n) for n in await pipe.execute()] if chosen else []
        depths = []
        for i, user_id in enumerate(chosen):
            waiting, in_flight, handed = counts[3 * i : 3 * i + 3]
            # a request handed over that no take returned yet waits (it is in the in-flight
            # list already); the three reads may be a moment apart, hence the bound
            handed = min(handed, in_flight)
            depth = QueueDepth(user_id, waiting + handed, in_flight - handed)
            if depth.waiting or depth.in_flight:
                depths.append(depth)
        return depths

    def _addressed(self, request: OrderRequest) -> OrderRequest:
        """``request`` with this instance's reply channel unless it already names one (a
        request handed over again keeps its waiter's address)."""
        if request.reply_to is not None:
            return request
        return attrs.evolve(request, reply_to=self._replies.channel)

    async def _pop_reply(self, user_id: str, request_id: str) -> OrderResult | None:
        with unavailable_on_failure("wait for a reply"):
            # One element: LPOP without a count.
            raw: str | bytes | None = await self._batch.command(
                "LPOP", response_key(user_id, request_id)
            )
        return None if raw is None else decode_result(raw)

    async def _move_oldest(self, user_id: str) -> OrderRequest | None:
        """The look of ``take``: the handed-over request, else the oldest moved (``_TAKE``)."""
        with unavailable_on_failure("take"):
            raw = await self._batch.script(
                self._take_next,
                [requests_key(user_id), processing_key(user_id), handed_key(user_id)],
                [],
            )
        return None if raw is None else decode_request(raw)


class RedisWorkerDirectory:
    """WorkerDirectory on Redis (keys in the module docstring).

    ``acquire`` (with the INCR of the fencing token), ``renew``, ``release`` and ``retire``
    are each one script (``renew_many``: one script per 200 leases, per slot on a cluster,
    16 at a time), so a lease is compared and changed in one step; ``request_start`` is
    deduplicated while the user's start request is pending, in the user's shard;
    ``next_start_request`` looks at every shard, starting at the one after the last it
    served (so no shard starves), and waits for a wake-up between looks (``Wakeups``: one
    connection for the process, whatever the waiters); ``wait_active`` polls the mark with
    a short backoff (1 ms doubling to 20 ms), so a cold start is seen within milliseconds.
    The hosts' records (``host_alive``, ``lapsed_hosts``) are one script each on the one key
    ``worker:hosts``, timed by the server's clock (``TIME``). Times to live are the server's
    (PX, whole milliseconds, at least 1). Raises KeyValueStoreUnavailable.
    """

    def __init__(self, connections: RedisConnections) -> None:
        self._client: Client = connections.commands
        self._shards = connections.queue_shards
        self._cluster = connections.cluster
        self._next_shard = 0
        self._starts = Wakeups(connections.commands, CONTROL_CHANNEL)
        self._batch = shared_batcher(self._client)
        self._acquire = self._client.register_script(_ACQUIRE)
        self._renew = self._client.register_script(_RENEW)
        self._renew_many = self._client.register_script(_RENEW_MANY)
        self._release = self._client.register_script(_RELEASE)
        self._retire = self._client.register_script(_RETIRE)
        self._request_start = self._client.register_script(_REQUEST_START)
        self._take_start = self._client.register_script(_TAKE_START)
        self._host_alive = self._client.register_script(_HOST_ALIVE)
        self._lapsed_hosts = self._client.register_script(_LAPSED_HOSTS)

    async def aclose(self) -> None:
        """Stop listening for start requests (the clients stay open: their owner closes
        them)."""
        await self._starts.aclose()

    async def is_active(self, user_id: str) -> bool:
        with unavailable_on_failure("active mark"):
            return bool(await self._client.exists(mark_key(user_id)))

    async def orphaned_users(self, limit: int = 100) -> list[str]:
        """SCAN the request and in-flight lists (a sweep, not a hot path) for users whose
        list is non-empty and whose mark is absent."""
        found: list[str] = []
        with unavailable_on_failure("orphan sweep"):
            async for raw in self._client.scan_iter(match=USER_PREFIX + "{*", count=500):
                key = text(raw)
                user_id = user_of_list(key)
                if user_id is None or user_id in found:
                    continue
                if await self._client.exists(mark_key(user_id)):
                    continue
                if await self._client.llen(key):
                    found.append(user_id)
                if len(found) >= limit:
                    break
        return found

    async def host_alive(self, holder: str, ttl_s: float) -> None:
        with unavailable_on_failure("host record"):
            await self._host_alive(keys=[HOSTS_KEY], args=[holder, px_ms(ttl_s)])

    async def lapsed_hosts(self) -> list[str]:
        with unavailable_on_failure("lapsed hosts"):
            lapsed = await self._lapsed_hosts(keys=[HOSTS_KEY])
        return [text(holder) for holder in lapsed]

    async def host_gone(self, holder: str) -> None:
        with unavailable_on_failure("host record"):
            await self._client.zrem(HOSTS_KEY, holder)

    async def request_start(self, user_id: str) -> None:
        shard = shard_of(user_id, self._shards)
        with unavailable_on_failure("start request"):
            await self._request_start(
                keys=list(control_keys(shard)), args=[user_id, CONTROL_CHANNEL, _START]
            )

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
        return await self._starts.look_until(_START, self._take_any_start, timeout_s, _RECHECK_S)

    async def _take_any_start(self) -> str | None:
        """The oldest start request of the first shard that has one, looking from the shard
        after the last one served; None when every shard is empty. The shards' lengths are
        read first, all at once (on one server in one pipeline: ``batching``), and only a
        shard with a request is asked for it: a wake-up costs one round trip to find the
        shard, not one per shard."""
        first = self._next_shard
        order = [(first + step) % self._shards for step in range(self._shards)]
        with unavailable_on_failure("next start request"):
            lengths = await asyncio.gather(
                *(self._batch.command("LLEN", control_keys(shard)[0]) for shard in order)
            )
            for shard, length in zip(order, lengths, strict=True):
                if not int(length):
                    continue
                user = await self._take_start(keys=list(control_keys(shard)))
                if user is not None:
                    self._next_shard = (shard + 1) % self._shards
                    return text(user)
        self._next_shard = (first + 1) % self._shards
        return None

    async def acquire(self, user_id: str, holder: str, ttl_s: float) -> int | None:
        with unavailable_on_failure("acquire lease"):
            token = await self._acquire(
                keys=[mark_key(user_id), fence_key(user_id)], args=[holder, px_ms(ttl_s)]
            )
        return None if token is None else int(token)

    async def renew(self, user_id: str, token: int, ttl_s: float) -> bool:
        with unavailable_on_failure("renew lease"):
            renewed = await self._renew(keys=[mark_key(user_id)], args=[token, px_ms(ttl_s)])
        return bool(int(renewed))

    async def renew_many(self, leases: Mapping[str, int], ttl_s: float) -> set[str]:
        lost: set[str] = set()
        batches = self._renew_batches(list(leases))
        limit = asyncio.Semaphore(_RENEW_PARALLEL)

        async def renew(batch: list[str]) -> None:
            async with limit:
                renewed = await self._renew_many(
                    keys=[mark_key(u) for u in batch],
                    args=[px_ms(ttl_s), *(leases[u] for u in batch)],
                )
            lost.update(u for u, ok in zip(batch, renewed, strict=True) if not int(ok))

        with unavailable_on_failure("renew leases"):
            await asyncio.gather(*(renew(batch) for batch in batches))
        return lost

    def _renew_batches(self, users: list[str]) -> list[list[str]]:
        """Batches of at most ``_RENEW_BATCH`` users whose marks share one slot on a cluster
        (a script's keys must), any users on one server."""
        groups: dict[int, list[str]] = {}
        for user_id in users:
            slot = key_slot(mark_key(user_id).encode()) if self._cluster else 0
            groups.setdefault(slot, []).append(user_id)
        return [
            group[start : start + _RENEW_BATCH]
            for group in groups.values()
            for start in range(0, len(group), _RENEW_BATCH)
        ]

    async def release(self, user_id: str, token: int) -> None:
        with unavailable_on_failure("release lease"):
            await self._release(keys=[mark_key(user_id)], args=[token])

    async def leases(self, limit: int = 1000) -> list[WorkerLease]:
        """SCAN the marks (an operator's read, not a hot path), then read them with MGET; a
        mark that expired in between is left out, as is a value that is not a lease."""
        pattern = MARK_PREFIX + "{*}"
        with unavailable_on_failure("leases"):
            keys = sorted(
                {text(raw) async for raw in self._client.scan_iter(match=pattern, count=500)}
            )[: max(0, limit)]
            # GETs in a pipeline, not MGET: on a cluster the marks are in many slots.
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
            values = await pipe.execute() if keys else []
        found: list[WorkerLease] = []
        for key, value in zip(keys, values, strict=True):
            holder, _, token = text(value).rpartition(":") if value is not None else ("", "", "")
            if holder and token.isdigit():
                found.append(WorkerLease(key[len(MARK_PREFIX) + 1 : -1], holder, int(token)))
        return found

    async def retire(self, user_id: str, token: int) -> bool:
        with unavailable_on_failure("retire"):
            retired = await self._retire(
                keys=[mark_key(user_id), requests_key(user_id), handed_key(user_id)],
                args=[token],
            )
        return bool(int(retired))

"""The order-tasks FIFO queue on Redis: message groups, delays, visibility timeout, dead letter.

Same observable behaviour as ``MemoryFillTaskQueue`` within a shard: among the messages that
are visible and whose group has nothing in flight, the oldest sent is delivered; a delivery
makes its message invisible for the visibility timeout, after which it is delivered again with
a higher ``receive_count``; ``ack``, ``retry`` and ``dead_letter`` act only on the latest
delivery of a message that was not settled since. Time is the server's clock (microseconds).

The queue is cut into shards (16 by default, ``keys``): a message goes to the shard of its
group (the user id), so a user's checks keep their order and their deduplication, and no
single Redis Cluster slot carries every user. A receive looks at the shards in turn, starting
at the one after the shard it last served, so no shard starves; across shards (different
users) the send order is not kept, as SQS FIFO keeps none across message groups. The counts
and lists for operators (``pending_count``, ``dead_letters``) sum over the shards.

``receive_many`` takes up to n deliveries in one look: one receive script call per shard
with something due, each delivering up to the count it is asked for, all sent together.
Every call goes through the client's shared batcher (``batching``), the settles too, so the
calls of a batch of checks share pipelines on one server (on a cluster each is sent alone).

Keys of one shard, under its prefix ``order-tasks.fifo:{sNN}`` (P; the hash tag ``{sNN}``
puts all of them in one slot):

* ``P:seq`` - message ids, in send order;
* ``P:msg:{id}`` - a hash: ``body`` (the FillTask as JSON), ``group``, ``count`` (deliveries),
  ``inflight`` (1 from a delivery until a retry or settle);
* ``P:timers`` - a sorted set, id -> when it next changes: a delayed message becomes visible,
  or an in-flight message's visibility timeout ends;
* ``P:group:{user_id}`` - a sorted set of the group's visible messages not in flight (score id);
* ``P:busy`` - a hash, group -> the id in flight;
* ``P`` itself - a sorted set, group -> its oldest visible id, for groups with nothing in flight
  (the queue head: the lowest score is the next delivery);
* ``P:dead`` - the dead-letter list, ``{"reason": ..., "task": {...}, "at": us}`` oldest first
  (``at``, the server's time of the move, orders the letters of all shards);
* ``P:dedup:{order_id}`` - set (NX) by a send, living for the deduplication window (300 s by
  default): while it exists, a send of the same order stores nothing (SQS FIFO's
  deduplication by MessageDeduplicationId, here the order id; an order belongs to one user,
  so to one shard).

Every script is called with P as its one key (the cluster routes it by that key) and reaches
the shard's other keys from it; they share P's hash tag, so they are in P's slot.

A receiver with nothing to take waits without polling: until the next timer of any shard is
due (the receive script tells when), or until a wake-up on the channel
``order-tasks.fifo:wakeups`` (one for all shards), which the other scripts publish when a
message became deliverable (the shard's head was empty) or a timer earlier than every other
of the shard was set.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from tradecore.fills import VISIBILITY_TIMEOUT_S
from tradecore.ports.messaging import FillDelivery, FillTask
from tradecore_adapters.redis.batching import shared_batcher
from tradecore_adapters.redis.client import Client, Wakeups, text
from tradecore_adapters.redis.codec import decode_task, encode_task, task_from_data
from tradecore_adapters.redis.errors import unavailable_on_failure
from tradecore_adapters.redis.keys import DEFAULT_SHARDS, check_shards, shard_of, shard_tag

log = logging.getLogger(__name__)

QUEUE_KEY = "order-tasks.fifo"
DEAD_LETTER_SUFFIX = ":dead"

_READY = "ready"
"""The one wake-up name on the queue's channel."""
_RECHECK_S = 30.0
"""Longest wait without looking (a wake-up is lost only while the listener reconnects, and
every watcher is woken when it has)."""
_TIMER_SLACK_S = 0.001
"""Added to a wait for a timer, so the look after it finds the timer due."""
_TIMER_BATCH = 500
"""Timers processed per receive; a larger backlog is worked off over the next receives."""
DEDUP_WINDOW_S = 300.0
"""How long a sent order's task deduplicates further sends of that order (SQS FIFO's window)."""

# ARGV[1] is the shard's prefix (= KEYS[1]), the last ARGV the wake-up channel.
#
# The scripts keep one invariant: READY holds g, scored by its oldest visible id, exactly when
# g has a visible message and nothing in flight. Each maintains it with the fewest commands
# its case needs (a script's cost is mostly its number of redis.call: each converts its
# arguments and reply between Lua and Redis), rather than recomputing it from scratch.
_COMMON = """
local P = ARGV[1]
local CHANNEL = ARGV[#ARGV]
local TIMERS = P .. ':timers'
local BUSY = P .. ':busy'
local READY = P
local function msg(id) return P .. ':msg:' .. id end
local function grp(g) return P .. ':group:' .. g end
local function fmt(x) return string.format('%.0f', x) end
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- g has nothing in flight now (its message in flight was just settled): it becomes ready
-- with its oldest visible message, if it has one. Wakes the waiting receivers when READY was
-- empty before (a message became deliverable while none was); returns whether it did.
local function freed(g)
  local head = redis.call('ZRANGE', grp(g), 0, 0, 'WITHSCORES')
  if not head[1] then return false end
  local was_ready = redis.call('ZCARD', READY) > 0
  redis.call('ZADD', READY, head[2], g)
  if was_ready then return false end
  redis.call('PUBLISH', CHANNEL, 'ready')
  return true
end
-- g just lost a visible message: unless g is busy (with another message: a receive may have
-- delivered an older one of g after this one's visibility timeout), READY follows its new
-- head. (A g that was not busy was in READY, so READY was not empty: nobody needs waking.)
local function lost_visible(g)
  if redis.call('HEXISTS', BUSY, g) == 1 then return end
  local head = redis.call('ZRANGE', grp(g), 0, 0, 'WITHSCORES')
  if head[1] then redis.call('ZADD', READY, head[2], g) else redis.call('ZREM', READY, g) end
end
-- Take the message a settle names out of the queue (its hash stays). It is either in flight
-- (BUSY names it, its visibility timer is set) or, its visibility timeout processed by a
-- receive, visible in its group. Returns whether it was in flight (its group is free now);
-- the caller keeps the invariant with ``freed`` or ``lost_visible``.
local function unplace(id, g)
  if redis.call('HGET', BUSY, g) == id then
    redis.call('HDEL', BUSY, g)
    redis.call('ZREM', TIMERS, id)
    return true
  end
  redis.call('ZREM', TIMERS, id)
  redis.call('ZREM', grp(g), id)
  return false
end
-- Wake the waiting receivers when the timer just set for ``id`` is now the earliest (a
-- receiver sleeps until the earliest timer).
local function notify_timer(id)
  if redis.call('ZRANGE', TIMERS, 0, 0)[1] == id then redis.call('PUBLISH', CHANNEL, 'ready') end
end
-- The message a receipt 'id.count' names, if that delivery is its latest and unsettled.
local function current(receipt)
  local id, count = string.match(receipt, '^(%d+)%.(%d+)$')
  if not id then return nil end
  local m = redis.call('HMGET', msg(id), 'group', 'count', 'inflight')
  if not m[1] or m[2] ~= count or m[3] ~= '1' then return nil end
  return id, m[1]
end
"""

# ARGV: prefix, body, group, delay (us), order id, deduplication window (ms). Returns the id,
# or '' when the order was sent within the window (nothing stored). A message visible at once
# is its group's newest (ids grow), so it is the group's head only if the group had none:
# NX adds g to READY then, and changes nothing otherwise.
_SEND = (
    _COMMON
    + """
if not redis.call('SET', P .. ':dedup:' .. ARGV[5], '1', 'NX', 'PX', ARGV[6]) then return '' end
local now = now_us()
local g = ARGV[3]
local id = tostring(redis.call('INCR', P .. ':seq'))
redis.call('HSET', msg(id), 'body', ARGV[2], 'group', g, 'count', 0, 'inflight', 0)
local visible_at = now + tonumber(ARGV[4])
if visible_at > now then
  redis.call('ZADD', TIMERS, fmt(visible_at), id)
  notify_timer(id)
  return id
end
redis.call('ZADD', grp(g), id, id)
if redis.call('HEXISTS', BUSY, g) == 0 then
  local was_ready = redis.call('ZCARD', READY) > 0
  redis.call('ZADD', READY, 'NX', id, g)
  if not was_ready then redis.call('PUBLISH', CHANNEL, 'ready') end
end
return id
"""
)

# ARGV: prefix, visibility timeout (us), timer batch, most deliveries wanted (n >= 1).
# Returns up to n deliveries, oldest head first, flat: {id1, count1, body1, id2, ...}; or
# {'', us until the earliest timer} ({'', -1} without timers) when nothing is deliverable.
# Due timers first: each message becomes visible in its group, and a group with nothing in
# flight takes it as its head when it is older than the head it had (ZADD LT; added when it
# had none); a message whose visibility timeout ended frees its group, whose head is then
# read (a message made visible while the group was busy may be older). Then the
# oldest heads are delivered: ZPOPMIN takes the group out of READY (it is busy now) with its
# head's id as the score.
_RECEIVE = (
    _COMMON
    + """
local now = now_us()
local due = redis.call('ZRANGEBYSCORE', TIMERS, '-inf', fmt(now), 'LIMIT', 0, tonumber(ARGV[3]))
if due[1] then
  redis.call('ZREMRANGEBYRANK', TIMERS, 0, #due - 1)  -- the due timers are the first ranks
  for _, id in ipairs(due) do
    local m = redis.call('HMGET', msg(id), 'group', 'inflight')
    local g = m[1]
    if g then
      redis.call('ZADD', grp(g), id, id)
      if m[2] == '1' and redis.call('HGET', BUSY, g) == id then
        -- its visibility timeout ended: g is free, and its head may be older than id
        redis.call('HDEL', BUSY, g)
        local head = redis.call('ZRANGE', grp(g), 0, 0, 'WITHSCORES')
        redis.call('ZADD', READY, head[2], g)
      elseif redis.call('HEXISTS', BUSY, g) == 0 then
        redis.call('ZADD', READY, 'LT', id, g)
      end
    end
  end
end
local visible_until = fmt(now + tonumber(ARGV[2]))
local out = {}
for _ = 1, tonumber(ARGV[4]) do
  local head = redis.call('ZPOPMIN', READY)
  if not head[1] then break end
  local g, id = head[1], fmt(tonumber(head[2]))
  redis.call('ZREM', grp(g), id)
  local m = redis.call('HMGET', msg(id), 'body', 'count')
  local count = tonumber(m[2]) + 1
  redis.call('HSET', msg(id), 'count', count, 'inflight', 1)
  redis.call('HSET', BUSY, g, id)
  redis.call('ZADD', TIMERS, visible_until, id)
  out[#out + 1] = id
  out[#out + 1] = count
  out[#out + 1] = m[1]
end
if out[1] then return out end
local first = redis.call('ZRANGE', TIMERS, 0, 0, 'WITHSCORES')
if not first[2] then return {'', -1} end
return {'', fmt(math.max(0, tonumber(first[2]) - now))}
"""
)

# KEYS: the shard's prefix (its READY set). Read-only: {at most deliverable now, us until
# the earliest timer (0: one is due) or -1 without timers}. The first is the ready groups plus
# the due timers: each due timer makes at most one more group ready (several may be of one
# group, or of a group still busy), so it bounds what a receive would deliver now.
_PEEK = """
local P = KEYS[1]
local TIMERS = P .. ':timers'
local ready = redis.call('ZCARD', P)
local first = redis.call('ZRANGE', TIMERS, 0, 0, 'WITHSCORES')
if not first[2] then return {ready, -1} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local next_us = math.max(0, tonumber(first[2]) - now)
local due = 0
if next_us == 0 then due = redis.call('ZCOUNT', TIMERS, '-inf', string.format('%.0f', now)) end
return {ready + due, string.format('%.0f', next_us)}
"""

# ARGV: prefix, receipt. Returns 1 when deleted.
_ACK = (
    _COMMON
    + """
local id, g = current(ARGV[2])
if not id then return 0 end
local in_flight = unplace(id, g)
redis.call('DEL', msg(id))
if in_flight then freed(g) else lost_visible(g) end
return 1
"""
)

# ARGV: prefix, receipt, delay (us). Returns 1 when re-scheduled. The message goes back where
# a send would put it, keeping its id (so its place in its group), behind a timer or visible.
_RETRY = (
    _COMMON
    + """
local id, g = current(ARGV[2])
if not id then return 0 end
local now = now_us()
local in_flight = unplace(id, g)
redis.call('HSET', msg(id), 'inflight', 0)
local visible_at = now + tonumber(ARGV[3])
local woke = false
if visible_at <= now then redis.call('ZADD', grp(g), id, id) end
if in_flight then woke = freed(g) else lost_visible(g) end
if visible_at > now then
  redis.call('ZADD', TIMERS, fmt(visible_at), id)
  if not woke then notify_timer(id) end
end
return 1
"""
)

# ARGV: prefix, receipt, reason. Returns 1 when moved to the dead letter.
_DEAD_LETTER = (
    _COMMON
    + """
local id, g = current(ARGV[2])
if not id then return 0 end
local body = redis.call('HGET', msg(id), 'body')
local in_flight = unplace(id, g)
redis.call('DEL', msg(id))
if in_flight then freed(g) else lost_visible(g) end
local t = redis.call('TIME')
local at = fmt(tonumber(t[1]) * 1000000 + tonumber(t[2]))
local letter = '{"reason":' .. cjson.encode(ARGV[3]) .. ',"task":' .. body .. ',"at":' .. at .. '}'
redis.call('RPUSH', P .. ':dead', letter)
return 1
"""
)


def _micros(seconds: float) -> int:
    return max(0, round(seconds * 1_000_000))


class RedisFillTaskQueue:
    """FillTaskQueue on Redis (keys and semantics in the module docstring).

    ``receive`` and ``receive_many`` wait, when no shard has a deliverable message, until
    the earliest timer or a wake-up (module docstring); the listener holds one connection
    from the first wait until ``aclose``. A send of an order already sent within
    ``dedup_window_s`` (by the server's clock) does nothing. A receipt is
    ``"{shard}/{id}.{count}"``. Raises KeyValueStoreUnavailable.
    """

    def __init__(
        self,
        client: Client,
        visibility_timeout_s: float = VISIBILITY_TIMEOUT_S,
        *,
        prefix: str = QUEUE_KEY,
        dedup_window_s: float = DEDUP_WINDOW_S,
        shards: int = DEFAULT_SHARDS,
    ) -> None:
        self._client = client
        self._visibility_us = _micros(visibility_timeout_s)
        self._dedup_window_ms = max(1, round(dedup_window_s * 1000))
        self._prefix = prefix
        self._shards = [f"{prefix}:{shard_tag(n)}" for n in range(check_shards(shards))]
        self._next_shard = 0
        self._wakeups = Wakeups(client, f"{prefix}:wakeups")
        self._send = client.register_script(_SEND)
        self._batch = shared_batcher(client)  # calls share pipelines (``batching``)
        self._receive = client.register_script(_RECEIVE)
        self._peek = client.register_script(_PEEK)
        self._ack = client.register_script(_ACK)
        self._retry = client.register_script(_RETRY)
        self._dead_letter = client.register_script(_DEAD_LETTER)

    @property
    def shard_prefixes(self) -> list[str]:
        """The prefix of each shard, in shard order."""
        return list(self._shards)

    async def send(self, task: FillTask, delay_s: float) -> None:
        shard = self._shards[shard_of(task.user_id, len(self._shards))]
        with unavailable_on_failure("send fill task"):
            await self._batch.script(
                self._send,
                [shard],
                [
                    shard,
                    encode_task(task),
                    task.user_id,
                    _micros(delay_s),
                    task.order_id,
                    self._dedup_window_ms,
                    self._wakeups.channel,
                ],
            )

    async def aclose(self) -> None:
        """Stop listening for wake-ups (the client stays open: its owner closes it)."""
        await self._wakeups.aclose()

    async def receive(self, timeout_s: float) -> FillDelivery | None:
        deliveries = await self.receive_many(1, timeout_s)
        return deliveries[0] if deliveries else None

    async def receive_many(self, limit: int, timeout_s: float) -> list[FillDelivery]:
        """Up to ``limit`` deliveries of one look (``_receive_now``), waiting as the class
        docstring says while a look finds nothing."""
        if limit < 1:
            raise ValueError("limit must be >= 1")
        next_timer_s: float | None = None

        async def look() -> list[FillDelivery] | None:
            nonlocal next_timer_s
            deliveries, next_timer_s = await self._receive_now(limit)
            return deliveries or None  # None: look_until goes on waiting

        def recheck_s() -> float:
            """Look again by the earliest timer the last look saw (a delayed check falls due
            with no wake-up), and at least every ``_RECHECK_S``."""
            if next_timer_s is None:
                return _RECHECK_S
            return min(_RECHECK_S, next_timer_s + _TIMER_SLACK_S)

        return await self._wakeups.look_until(_READY, look, timeout_s, recheck_s) or []

    # The settles go through the batcher, as the sends do: a batch of checks settled at once
    # shares pipelines. Each is still one script on one shard, run once (``batching``).

    async def ack(self, delivery: FillDelivery) -> None:
        shard, receipt = self._receipt(delivery)
        if shard is None:
            return
        with unavailable_on_failure("ack fill task"):
            await self._batch.script(self._ack, [shard], [shard, receipt, self._wakeups.channel])

    async def retry(self, delivery: FillDelivery, delay_s: float) -> None:
        shard, receipt = self._receipt(delivery)
        if shard is None:
            return
        with unavailable_on_failure("retry fill task"):
            await self._batch.script(
                self._retry, [shard], [shard, receipt, _micros(delay_s), self._wakeups.channel]
            )

    async def dead_letter(self, delivery: FillDelivery, reason: str) -> None:
        shard, receipt = self._receipt(delivery)
        if shard is None:
            return
        with unavailable_on_failure("dead-letter fill task"):
            await self._batch.script(
                self._dead_letter, [shard], [shard, receipt, reason, self._wakeups.channel]
            )

    async def dead_letters(self) -> list[tuple[FillTask, str]]:
        """The dead letters of every shard, oldest first (by the time each was moved)."""
        entries: list[tuple[int, int, int, dict[str, object]]] = []
        with unavailable_on_failure("list dead letters"):
            for number, shard in enumerate(self._shards):
                raws = await self._client.lrange(shard + DEAD_LETTER_SUFFIX, 0, -1)
                for position, raw in enumerate(raws):
                    entry = json.loads(raw)
                    entries.append((int(entry.get("at", 0)), number, position, entry))
        entries.sort(key=lambda e: e[:3])
        return [(task_from_data(e["task"]), str(e["reason"])) for *_, e in entries]

    async def pending_count(self) -> int:
        """SCAN the message hashes of every shard (an operator's read, not a hot path): each
        unsettled message has one, and settling deletes it."""
        with unavailable_on_failure("count fill tasks"):
            return sum(
                [
                    1
                    async for _ in self._client.scan_iter(
                        match=f"{self._prefix}:{{s*}}:msg:*", count=500
                    )
                ]
            )

    def _receipt(self, delivery: FillDelivery) -> tuple[str | None, str]:
        """The shard prefix and the shard's own receipt (``id.count``) of a receipt; no
        shard for a receipt this queue never gave."""
        number, slash, inner = delivery.receipt.partition("/")
        if not slash or not number.isdigit() or int(number) >= len(self._shards):
            return None, ""
        return self._shards[int(number)], inner

    async def _receive_now(self, limit: int) -> tuple[list[FillDelivery], float | None]:
        """One look at every shard, from the one after the last served: up to ``limit``
        deliveries, in shard order from there (oldest first within a shard); or none and the
        seconds until the earliest timer of all shards (None when no shard has a timer).

        The shards are first peeked at all at once (read-only, so on one server the peeks
        share one pipeline: ``batching``); an empty queue costs that one round trip. Each
        shard with something due is then asked, in turn, for as many as its peek allows and
        ``limit`` still leaves, all those asks at once (one pipeline again). A peek's count
        is a bound (a due timer may not make a group ready), so a look may deliver fewer
        than were deliverable, up to ``limit``: the next look, starting after the last shard
        served, gets the rest. When every ask came back empty (another receiver was first),
        the due shards the limit had left out are asked before the look gives up."""
        first = self._next_shard
        count = len(self._shards)
        order = [(first + step) % count for step in range(count)]
        earliest_us: int | None = None

        def note_timer(next_us: int) -> None:
            nonlocal earliest_us
            if next_us >= 0 and (earliest_us is None or next_us < earliest_us):
                earliest_us = next_us

        deliveries: list[FillDelivery] = []
        last_served: int | None = None
        with unavailable_on_failure("receive fill task"):
            peeks = await asyncio.gather(
                *(self._batch.script(self._peek, [self._shards[n]], []) for n in order)
            )
            due: list[tuple[int, int]] = []  # (shard number, at most deliverable), in order
            for number, (deliverable, next_us) in zip(order, peeks, strict=True):
                if int(deliverable) > 0:
                    due.append((number, int(deliverable)))
                else:
                    note_timer(int(next_us))
            while due and not deliveries:
                asks: list[tuple[int, int]] = []
                remaining = limit
                while due and remaining > 0:
                    number, deliverable = due.pop(0)
                    asks.append((number, min(deliverable, remaining)))
                    remaining -= asks[-1][1]
                replies = await self._ask(asks)
                for (number, _), reply in zip(asks, replies, strict=True):
                    if isinstance(reply, int):
                        note_timer(reply)  # another receiver was first
                    elif reply:
                        deliveries.extend(reply)
                        last_served = number
        self._next_shard = (first if last_served is None else last_served) + 1
        self._next_shard %= count
        if deliveries:
            return deliveries, None
        return [], None if earliest_us is None else earliest_us / 1_000_000

    async def _ask(self, asks: list[tuple[int, int]]) -> list[list[FillDelivery] | int]:
        """Run the receive script on each (shard number, count) of ``asks`` at once: per ask,
        its deliveries, or (none deliverable) the microseconds until the shard's earliest
        timer (-1: none). A failed ask fails the call unless another ask delivered: those
        deliveries are in flight now and are returned (a look that raised would leave them
        invisible for the visibility timeout), the failed shard is asked again next look."""
        calls = [
            self._batch.script(
                self._receive,
                [self._shards[number]],
                [
                    self._shards[number],
                    self._visibility_us,
                    _TIMER_BATCH,
                    wanted,
                    self._wakeups.channel,
                ],
            )
            for number, wanted in asks
        ]
        found = await asyncio.gather(*calls, return_exceptions=True)
        replies: list[list[FillDelivery] | int] = []
        failure: BaseException | None = None
        for (number, _), reply in zip(asks, found, strict=True):
            if isinstance(reply, BaseException):
                failure = failure or reply
                replies.append(-1)
            elif not text(reply[0]):
                replies.append(int(reply[1]))
            else:
                replies.append(self._deliveries(number, reply))
        if failure is not None:
            if not isinstance(failure, Exception) or not any(
                isinstance(r, list) and r for r in replies
            ):
                raise failure
            log.warning("fill task receive failed on a shard, the others delivered: %r", failure)
        return replies

    def _deliveries(self, number: int, flat: list[Any]) -> list[FillDelivery]:
        """The deliveries of shard ``number``'s receive reply ``{id, count, body, ...}``."""
        deliveries = []
        for at in range(0, len(flat), 3):
            message_id, received_count, body = flat[at : at + 3]
            receipt = f"{number}/{text(message_id)}.{int(received_count)}"
            task = decode_task(text(body))
            deliveries.append(FillDelivery(task, receipt, int(received_count)))
        return deliveries

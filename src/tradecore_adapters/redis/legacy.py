"""One-time adoption of the keys an older release wrote before per-user hash tags.

Older releases named a user's keys without braces (``trading:user:u1:requests``,
``trading:user:u1:processing``, ``worker:fence:u1``) and kept one unsharded fill-check queue
(``order-tasks.fifo:msg:{id}`` hashes). Those releases ran on a single server only, so the
old keys exist only there. ``adopt_legacy_keys`` moves them under the current names:

* a request list's entries go before the new list's (they are older), an in-flight list's
  after the new one's, each user in one script, so a request is never in both or neither;
* a fencing counter is raised to the old one's value if that is higher, so tokens never go
  back;
* each waiting fill check is sent again through the sharded queue (deduplicated by order
  id, so a crash between the send and the delete cannot make two series), then deleted.

Old marks (``worker:active:u1``) are left to expire: the upgrade stops the old worker hosts
first (docs/operations.md). The function is idempotent and does nothing on a cluster.
"""

from __future__ import annotations

import logging

from tradecore.ports.messaging import FillTaskQueue
from tradecore_adapters.redis.client import RedisConnections, text
from tradecore_adapters.redis.codec import decode_task
from tradecore_adapters.redis.errors import unavailable_on_failure
from tradecore_adapters.redis.messaging import fence_key, processing_key, requests_key

log = logging.getLogger(__name__)

_OLD_USER_PREFIX = "trading:user:"
_OLD_FENCE_PREFIX = "worker:fence:"
_OLD_TASK_PATTERN = "order-tasks.fifo:msg:*"

# KEYS: old requests, new requests, old in-flight, new in-flight. Old requests before the new
# ones, old in-flight entries after the new ones; the old lists are deleted.
_ADOPT_LISTS = """
local old = redis.call('LRANGE', KEYS[1], 0, -1)
for i = #old, 1, -1 do redis.call('LPUSH', KEYS[2], old[i]) end
for _, entry in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  redis.call('RPUSH', KEYS[4], entry)
end
redis.call('DEL', KEYS[1], KEYS[3])
return #old
"""

# KEYS: old fence, new fence. The new counter is at least the old one; the old is deleted.
_ADOPT_FENCE = """
local old = tonumber(redis.call('GET', KEYS[1]) or '0')
if old > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], old) end
redis.call('DEL', KEYS[1])
return old
"""


def _old_user(key: str, suffixes: tuple[str, ...]) -> str | None:
    """The user id of an old, brace-less request or in-flight list key."""
    if "{" in key or not key.startswith(_OLD_USER_PREFIX):
        return None
    for suffix in suffixes:
        if key.endswith(suffix):
            return key[len(_OLD_USER_PREFIX) : -len(suffix)] or None
    return None


async def adopt_legacy_keys(connections: RedisConnections, tasks: FillTaskQueue) -> int:
    """Move the keys of an older release under the current names (module docstring); the
    number of keys adopted. Raises KeyValueStoreUnavailable."""
    if connections.cluster:
        return 0
    client = connections.commands
    adopt_lists = client.register_script(_ADOPT_LISTS)
    adopt_fence = client.register_script(_ADOPT_FENCE)
    adopted = 0
    with unavailable_on_failure("adopt legacy keys"):
        users: set[str] = set()
        async for raw in client.scan_iter(match=_OLD_USER_PREFIX + "*", count=500):
            user_id = _old_user(text(raw), (":requests", ":processing"))
            if user_id is not None:
                users.add(user_id)
        for user_id in sorted(users):
            old_requests = f"{_OLD_USER_PREFIX}{user_id}:requests"
            old_processing = f"{_OLD_USER_PREFIX}{user_id}:processing"
            await adopt_lists(
                keys=[
                    old_requests,
                    requests_key(user_id),
                    old_processing,
                    processing_key(user_id),
                ]
            )
            adopted += 1
        async for raw in client.scan_iter(match=_OLD_FENCE_PREFIX + "*", count=500):
            key = text(raw)
            if "{" not in key:
                user_id = key[len(_OLD_FENCE_PREFIX) :]
                await adopt_fence(keys=[key, fence_key(user_id)])
                adopted += 1
        async for raw in client.scan_iter(match=_OLD_TASK_PATTERN, count=500):
            key = text(raw)
            body = await client.hget(key, "body")
            if body is not None:
                await tasks.send(decode_task(text(body)), 0)
            await client.delete(key)
            adopted += 1
    if adopted:
        log.warning("adopted %d Redis keys of an older release under the current names", adopted)
    return adopted

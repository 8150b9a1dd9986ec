"""Key names shared by the Redis adapters: per-user hash tags and queue shards.

Redis Cluster places a key by the text between its first ``{`` and the next ``}`` (the hash
tag), and a script may only touch keys of one slot. So every key of one user carries the
user id as its hash tag (``worker:active:{u1}``, ``trading:user:{u1}:requests``, ...) and
every script over a user's keys stays in that user's slot; the same names are used on a
single server, where the braces are plain characters (one naming, no mode switch).

Queues shared by all users (the worker-control start requests, the order-tasks FIFO queue)
are cut into ``shards`` shards, each under its own hash tag (``worker-control.fifo:{s07}``),
so no single slot carries every user. A user always maps to the same shard: the CRC-32 of
its id modulo the shard count, the same in every process and every Python version.
"""

from __future__ import annotations

import zlib

DEFAULT_SHARDS = 16
"""Shards of each shared queue; every process of a deployment must use the same count."""
MAX_SHARDS = 256


def tagged(user_id: str) -> str:
    """``user_id`` as a hash tag: ``{user_id}``."""
    return "{" + user_id + "}"


def shard_of(user_id: str, shards: int) -> int:
    """The shard of ``user_id`` among ``shards`` (stable across processes and restarts)."""
    return zlib.crc32(user_id.encode()) % shards


def shard_tag(shard: int) -> str:
    """The hash tag of shard ``shard``: ``{s07}``."""
    return f"{{s{shard:02d}}}"


def check_shards(shards: int) -> int:
    """``shards`` when it is a valid shard count (1 to ``MAX_SHARDS``); ValueError else."""
    if not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"a queue has 1 to {MAX_SHARDS} shards, not {shards}")
    return shards

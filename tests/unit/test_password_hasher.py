"""Argon2 hashing runs off the event loop at the lowest CPU priority the system offers, so a
burst of logins never takes CPU from the order paths (issue 3: webhook p99 while 20 logins
run)."""

from __future__ import annotations

import os
import sys
import threading

import argon2
import pytest

from tradecore_adapters.crypto.passwords import Argon2PasswordHasher


class ProbingArgon2(argon2.PasswordHasher):
    """Notes the thread, scheduling policy and nice value each hash runs with."""

    seen: list[tuple[int, int, int]]

    def hash(self, password: str | bytes, *, salt: bytes | None = None) -> str:
        native_id = threading.get_native_id()
        self.seen.append(
            (native_id, os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, native_id))
        )
        return super().hash(password, salt=salt)


def probing() -> ProbingArgon2:
    probe = ProbingArgon2(time_cost=1, memory_cost=1024, parallelism=1)
    probe.seen = []
    return probe


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread scheduling policy is Linux's")
async def test_hashes_run_in_an_idle_priority_thread() -> None:
    probe = probing()
    hasher = Argon2PasswordHasher(max_concurrency=1, hasher=probe)
    probe.seen.clear()  # the constructor's own dummy hash ran on this thread

    encoded = await hasher.hash("correct horse battery staple")

    [(native_id, policy, nice)] = probe.seen
    assert native_id != threading.get_native_id()
    assert policy == os.SCHED_IDLE
    assert nice == 19
    assert await hasher.verify(encoded, "correct horse battery staple")


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread scheduling policy is Linux's")
async def test_the_event_loop_thread_keeps_its_priority() -> None:
    before = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
    hasher = Argon2PasswordHasher(max_concurrency=1, hasher=probing())

    await hasher.hash("x")

    assert (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)) == before

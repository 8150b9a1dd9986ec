"""The sign-in throttles: sliding windows on the ``RateLimiter`` port, keyed by client address
and by account (docs/security.md, "Login throttling").

An attempt takes a slot in each of its windows before any password work; when one window is
full the attempt is refused with 429 and the time until a slot frees up, and the slots it
took in the other windows are given back. A caller that learns the attempt does not count (a
login that succeeded) gives its slots back, so the windows hold failures only. Account keys
hold a digest of the e-mail address, never the address.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from tradecore.ports.protection import RateLimiter
from tradecore.services.vocabulary import Rejected
from tradecore.sessions import hash_token


@attrs.frozen
class Window:
    """One sliding window: its store key, how many attempts it admits, and the rule's name
    for the audit entry (``ip``, ``account_ip``, ``account``)."""

    key: str
    limit: int
    rule: str


@attrs.frozen
class Throttled:
    """An attempt refused by the window of ``rule``; ``retry_after_s`` until a slot frees."""

    rule: str
    retry_after_s: float | None

    def rejection(self) -> Rejected:
        return Rejected(
            429,
            "rate_limited",
            "Too many attempts; try again later",
            retry_after_s=self.retry_after_s,
        )


def ip_window(flow: str, ip: str, limit: int) -> Window:
    return Window(f"auth-{flow}:ip:{ip}", limit, "ip")


def account_window(flow: str, email: str, limit: int) -> Window:
    return Window(f"auth-{flow}:account:{hash_token(email)}", limit, "account")


def account_ip_window(flow: str, email: str, ip: str, limit: int) -> Window:
    return Window(f"auth-{flow}:account:{hash_token(email)}:ip:{ip}", limit, "account_ip")


class AttemptThrottle:
    """Takes and gives back slots of ``window_s``-long windows; without a limiter (a
    deployment that wires none) nothing is throttled."""

    def __init__(self, limiter: RateLimiter | None, window_s: float) -> None:
        self._limiter = limiter
        self._window_s = window_s

    async def take(self, windows: Sequence[Window]) -> tuple[str, ...] | Throttled:
        """A slot in every window (the keys taken, in order), or the first full window's
        refusal, with the slots taken before it given back."""
        if self._limiter is None:
            return ()
        taken: list[str] = []
        for window in windows:
            decision = await self._limiter.hit(window.key, window.limit, self._window_s)
            if not decision.allowed:
                await self.give_back(taken)
                return Throttled(window.rule, decision.retry_after_s)
            taken.append(window.key)
        return tuple(taken)

    async def give_back(self, keys: Sequence[str]) -> None:
        """Return the slots of an attempt that does not count. Never raises."""
        if self._limiter is None:
            return
        for key in keys:
            await self._limiter.release(key)

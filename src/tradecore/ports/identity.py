"""Password hashing, signed tokens, the bot challenge and outgoing mail."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import attrs


@runtime_checkable
class PasswordHasher(Protocol):
    """Argon2id password hashing; CPU-heavy calls run off the event loop with a cap."""

    async def hash(self, password: str) -> str:
        """An encoded hash of ``password`` (salt and parameters included)."""
        ...

    async def verify(self, encoded: str, password: str) -> bool:
        """True when ``password`` matches ``encoded``; False on any mismatch, never raises."""
        ...

    def needs_rehash(self, encoded: str) -> bool:
        """True when ``encoded`` was made with parameters weaker than the current ones."""
        ...

    async def verify_dummy(self, password: str) -> None:
        """Spend the time of one verification, for unknown users (no account enumeration)."""
        ...


@runtime_checkable
class TokenCodec(Protocol):
    """Signs and verifies JWTs (HS256, pinned). Claims are plain JSON values."""

    def encode(self, claims: Mapping[str, Any]) -> str:
        """A signed token carrying ``claims``."""
        ...

    def decode(self, token: str, *, expected_type: str) -> Mapping[str, Any]:
        """The verified claims. Raises ``InvalidToken`` on a bad signature, expiry, a missing
        required claim (exp, iat, sub, sid, typ, jti), or ``typ`` other than ``expected_type``."""
        ...


@runtime_checkable
class CaptchaVerifier(Protocol):
    """Server-side verification of the bot-challenge token."""

    async def verify(self, token: str, client_ip: str) -> bool:
        """True when the provider accepts ``token`` for ``client_ip``; False otherwise,
        including when the provider cannot be reached (fail closed)."""
        ...


@attrs.frozen
class MailMessage:
    """One outgoing e-mail with a text and an HTML part (the HTML already escaped)."""

    to: str
    subject: str
    text: str
    html: str


@runtime_checkable
class Mailer(Protocol):
    """Outgoing mail."""

    async def send(self, message: MailMessage) -> None:
        """Hand ``message`` to the mail server. Raises on failure; callers that must not fail
        (security alerts) catch and log."""
        ...

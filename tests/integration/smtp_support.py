"""What the mail tests share: an aiosmtpd handler that keeps what it received, free ports."""

from __future__ import annotations

import email
import email.policy
import socket
from email.message import EmailMessage
from typing import Any


class Inbox:
    """aiosmtpd handler that keeps every message (parsed) and envelope it received."""

    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []
        self.envelopes: list[tuple[str, list[str]]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        self.messages.append(parsed)
        return "250 OK"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

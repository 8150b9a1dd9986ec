"""A Mailer that keeps messages in memory and logs that they were sent.

The embedded default has no mail server; this outbox lets an operator (and the tests) see
what would have gone out. It logs the recipient and subject only, never the body.
"""

from __future__ import annotations

import logging

from tradecore.ports.identity import MailMessage

log = logging.getLogger(__name__)


class LoggingOutbox:
    """Mailer that records every message in ``sent`` (bounded to the newest ``keep``)."""

    def __init__(self, keep: int = 1000) -> None:
        self.sent: list[MailMessage] = []
        self._keep = keep

    async def send(self, message: MailMessage) -> None:
        self.sent.append(message)
        del self.sent[: -self._keep]
        log.info("mail to %s: %s", message.to, message.subject)

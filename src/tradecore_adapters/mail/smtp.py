"""A Mailer over SMTP with aiosmtplib.

``SMTP_URL`` selects the server: ``smtp://user:pass@host:port`` (plain, or STARTTLS with
``?starttls=1``), ``smtps://...`` (TLS from the first byte). Every send has a timeout; the
password never appears in a repr or a log line.
"""

from __future__ import annotations

import ssl
from email.message import EmailMessage
from urllib.parse import parse_qs, unquote, urlsplit

import aiosmtplib
import attrs

from tradecore.ports.identity import MailMessage

DEFAULT_TIMEOUT_S = 10.0
_TRUE = {"1", "true", "yes", "on"}


class SmtpConfigError(ValueError):
    """SMTP_URL cannot be used; the message is safe to print (no password)."""


@attrs.frozen
class SmtpSettings:
    """Where and how to send. ``tls`` is implicit TLS (smtps); ``starttls`` upgrades a plain
    connection and fails if the server does not offer it."""

    host: str
    port: int
    username: str | None = None
    password: str | None = attrs.field(default=None, repr=False)
    tls: bool = False
    starttls: bool = False
    validate_certs: bool = True

    @classmethod
    def from_url(cls, url: str) -> SmtpSettings:
        parts = urlsplit(url)
        if parts.scheme not in ("smtp", "smtps"):
            raise SmtpConfigError("SMTP_URL must start with smtp:// or smtps://")
        if not parts.hostname:
            raise SmtpConfigError("SMTP_URL has no host")
        try:
            port = parts.port
        except ValueError as e:
            raise SmtpConfigError("SMTP_URL has an invalid port") from e
        query = {k: v[-1].lower() for k, v in parse_qs(parts.query).items()}
        tls = parts.scheme == "smtps"
        return cls(
            host=parts.hostname,
            port=port or (465 if tls else 25),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            tls=tls,
            starttls=query.get("starttls") in _TRUE,
            validate_certs=query.get("verify", "1") in _TRUE,
        )


def build_email(message: MailMessage, mail_from: str) -> EmailMessage:
    """A multipart/alternative e-mail with the text part first and the HTML part second."""
    email = EmailMessage()
    email["From"] = mail_from
    email["To"] = message.to
    email["Subject"] = message.subject
    email.set_content(message.text)
    email.add_alternative(message.html, subtype="html")
    return email


class SmtpMailer:
    """Mailer that hands each message to an SMTP server, with a timeout per send."""

    def __init__(
        self,
        settings: SmtpSettings,
        mail_from: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        self._settings = settings
        self._mail_from = mail_from
        self._timeout_s = timeout_s
        self._tls_context = tls_context

    async def send(self, message: MailMessage) -> None:
        settings = self._settings
        await aiosmtplib.send(
            build_email(message, self._mail_from),
            hostname=settings.host,
            port=settings.port,
            username=settings.username,
            password=settings.password,
            use_tls=settings.tls,
            start_tls=settings.starttls and not settings.tls,
            validate_certs=settings.validate_certs,
            tls_context=self._tls_context,
            timeout=self._timeout_s,
        )

"""The SMTP mailer against a real SMTP server (aiosmtpd on a free loopback port)."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from smtp_support import Inbox, free_port

from tradecore.ports.identity import MailMessage
from tradecore_adapters.mail.smtp import SmtpConfigError, SmtpMailer, SmtpSettings

MESSAGE = MailMessage(
    to="ada@example.com",
    subject="Security alert: wrong webhook secret (Main)",
    text="Someone sent a webhook with a wrong secret.",
    html="<p>Someone sent a webhook with a <b>wrong secret</b>.</p>",
)


def self_signed(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a fresh self-signed certificate for 127.0.0.1, and a client
    context that trusts exactly that certificate."""
    import ipaddress

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_file, key_file)
    client = ssl.create_default_context(cafile=str(cert_file))
    return server, client


async def test_message_arrives_with_text_and_html_parts(inbox: tuple[Inbox, int]) -> None:
    handler, port = inbox
    mailer = SmtpMailer(SmtpSettings("127.0.0.1", port), "alerts@tradecore.example")

    await mailer.send(MESSAGE)

    (received,) = handler.messages
    assert handler.envelopes == [("alerts@tradecore.example", ["ada@example.com"])]
    assert received["Subject"] == MESSAGE.subject
    assert received.get_content_type() == "multipart/alternative"
    parts = {
        part.get_content_type(): part.get_payload(decode=True).decode()
        for part in received.walk()
        if not part.is_multipart()
    }
    assert MESSAGE.text in parts["text/plain"]
    assert MESSAGE.html in parts["text/html"]


async def test_starttls_when_the_url_asks_for_it(tmp_path: Path) -> None:
    server_context, client_context = self_signed(tmp_path)
    handler = Inbox()
    port = free_port()
    controller = Controller(
        handler,
        hostname="127.0.0.1",
        port=port,
        tls_context=server_context,
        require_starttls=True,
    )
    controller.start()
    try:
        settings = SmtpSettings.from_url(f"smtp://127.0.0.1:{port}?starttls=1")
        mailer = SmtpMailer(settings, "alerts@example.com", tls_context=client_context)
        await mailer.send(MESSAGE)
        plain = SmtpMailer(SmtpSettings("127.0.0.1", port), "alerts@example.com")
        with pytest.raises(Exception):  # noqa: B017, PT011 - the server refuses plain text
            await plain.send(MESSAGE)
    finally:
        controller.stop()

    assert len(handler.messages) == 1


async def test_unreachable_server_raises_quickly() -> None:
    mailer = SmtpMailer(SmtpSettings("127.0.0.1", free_port()), "a@example.com", timeout_s=2)

    with pytest.raises(Exception):  # noqa: B017, PT011 - any failure; callers catch and log
        await mailer.send(MESSAGE)


@pytest.fixture
async def silent_server() -> AsyncIterator[int]:
    """Accepts connections and never says a word: a hanging mail server."""
    writers: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_hanging_server_times_out(silent_server: int) -> None:
    mailer = SmtpMailer(SmtpSettings("127.0.0.1", silent_server), "a@example.com", timeout_s=0.2)

    with pytest.raises(Exception):  # noqa: B017, PT011 - a timeout, never a hang
        await asyncio.wait_for(mailer.send(MESSAGE), timeout=5)


def test_url_parsing_and_the_password_stays_out_of_the_repr() -> None:
    settings = SmtpSettings.from_url("smtps://alerts%40example.com:p%40ss@mail.example.com")

    assert (settings.host, settings.port, settings.tls) == ("mail.example.com", 465, True)
    assert settings.username == "alerts@example.com"
    assert settings.password == "p@ss"
    assert "p@ss" not in repr(settings)
    assert SmtpSettings.from_url("smtp://mail.example.com:2525?starttls=1").starttls
    assert SmtpSettings.from_url("smtp://mail.example.com").port == 25


@pytest.mark.parametrize("url", ["http://mail.example.com", "smtp://", "smtp://host:notaport"])
def test_unusable_urls_are_refused(url: str) -> None:
    with pytest.raises(SmtpConfigError):
        SmtpSettings.from_url(url)

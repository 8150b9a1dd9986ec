"""Security events end to end: HTTP requests against the app, the audit log, and alert mails
delivered to a real SMTP server (aiosmtpd on a free loopback port) through ``SMTP_URL``.

The app is built by the container as ``tradecore serve`` builds it, on a fake clock; only the
clock, randomness and password-hashing cost are replaced. Waits are bounded
(``asyncio.wait_for``); nothing asserts on elapsed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import ipaddress
import json
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from email.message import EmailMessage
from http.cookies import SimpleCookie
from typing import Any

import argon2
import attrs
import pytest
from aiohttp import ClientResponse, DummyCookieJar
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner
from dependency_injector import providers
from hypothesis import given
from hypothesis import strategies as st
from smtp_support import Inbox, free_port

from tradecore.attacks import ATTACK_POLICIES
from tradecore.audit import AuditAction, AuditEntry, RequestContext, StoredAuditEntry
from tradecore.identity import AllowedIp, Plan, User
from tradecore.services.accounts.provisioning import NewAccount
from tradecore.services.audit.attack_report import (
    ACCOUNT_COUNT_LIMIT,
    MAX_DAYS,
    MAX_PAGE,
    MAX_PAGE_SIZE,
    ReportQuery,
    parse_report_query,
)
from tradecore.services.execution.worker_host import HostSettings
from tradecore.services.vocabulary import Rejected
from tradecore.testing.clock import FakeClock, FakeSleeper, SeededRandom
from tradecore_adapters.crypto.passwords import Argon2PasswordHasher
from tradecore_adapters.http import runner_options
from tradecore_adapters.mail.smtp import SmtpMailer, SmtpSettings
from tradecore_entrypoints.cli import main
from tradecore_entrypoints.container import Application, build_container, make_app
from tradecore_entrypoints.settings import ConfigError, Settings
from tradecore_entrypoints.system import System

PASSWORD = "correct horse battery staple"
MAIL_FROM = "alerts@tradecore.test"
ATTACKER_IP = "198.51.100.23"
WRONG_SECRET = "guessed-secret-5d41402abc4b2a76"
HOSTILE_NAME = '<script>alert("name")</script> Main & Co'
HOSTILE_AGENT = "<script>alert('agent')</script> curl/8.0"
WAIT_S = 30.0


# --- a real SMTP server ------------------------------------------------------------------------


class SilentServer:
    """A TCP server that accepts connections and never says a word: a hanging mail server.
    ``hang_up`` closes every connection it holds."""

    def __init__(self) -> None:
        self.connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.connected = asyncio.Event()

    async def hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.append((reader, writer))
        self.connected.set()

    def hang_up(self) -> None:
        for _, writer in self.connections:
            writer.close()


@pytest.fixture
async def silent() -> AsyncIterator[tuple[SilentServer, int]]:
    handler = SilentServer()
    server = await asyncio.start_server(handler.hold, "127.0.0.1", 0)
    try:
        yield handler, server.sockets[0].getsockname()[1]
    finally:
        handler.hang_up()
        server.close()
        await server.wait_closed()


def parts(message: EmailMessage) -> tuple[str, str]:
    """The decoded text and HTML parts."""
    text = message.get_body(preferencelist=("plain",))
    markup = message.get_body(preferencelist=("html",))
    assert text is not None and markup is not None
    return str(text.get_content()), str(markup.get_content())


# --- the app -----------------------------------------------------------------------------------


def mail_settings(port: int) -> Settings:
    """SMTP at ``port``; 127.0.0.1 is a trusted proxy so tests can give a source IP."""
    return Settings(
        smtp_url=f"smtp://127.0.0.1:{port}",
        mail_from=MAIL_FROM,
        trusted_proxies=(ipaddress.ip_network("127.0.0.1/32"),),
    )


@attrs.define
class Trader:
    env: Env
    user: User
    account: NewAccount

    def body(self, **changes: Any) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "action": "buy",
            "symbol": "BTCUSDT",
            "quantity": 1,
            "timestamp": self.env.clock.now().isoformat(),
            "secret": self.account.webhook_secret,
        }
        return {**fields, **changes}

    async def webhook(
        self, body: dict[str, Any] | None = None, *, ip: str = ATTACKER_IP
    ) -> ClientResponse:
        return await self.env.client.post(
            f"/webhook/{self.account.webhook_token}/order",
            data=json.dumps(self.body() if body is None else body).encode(),
            headers={
                "Content-Type": "application/json",
                "User-Agent": HOSTILE_AGENT,
                "X-Forwarded-For": ip,
            },
        )

    async def attack(self, **changes: Any) -> ClientResponse:
        """A webhook with a wrong secret."""
        return await self.webhook(self.body(secret=WRONG_SECRET, **changes))


@attrs.define
class Env:
    client: TestClient[Any, Any]
    container: Application
    system: System
    clock: FakeClock

    async def trader(self, email_address: str, account_name: str = "Main") -> Trader:
        user = await self.system.provisioning.create_user(
            email_address, PASSWORD, plan=Plan.PRO, terms_version="1"
        )
        return Trader(self, user, await self.account(user, account_name))

    async def account(self, user: User, name: str) -> NewAccount:
        return await self.system.provisioning.create_account(user, name, credentials_verified=True)

    def audit(self, user_id: str) -> list[StoredAuditEntry]:
        return [s for s in self.system.audit.all() if s.entry.user_id == user_id]

    async def drain(self) -> None:
        """Every alert in flight has been sent or has failed."""
        await asyncio.wait_for(self.system.events.drain(), WAIT_S)

    async def login(self, email_address: str) -> dict[str, str]:
        """Headers of a logged-in browser: its access cookie and CSRF token."""
        response = await self.client.post(
            "/auth/login", json={"email": email_address, "password": PASSWORD}
        )
        assert response.status == 200, await response.text()
        jar: SimpleCookie = SimpleCookie()
        for header in response.headers.getall("Set-Cookie", []):
            jar.load(header)
        csrf = (await response.json())["csrf_token"]
        return {"Cookie": f"access_token={jar['access_token'].value}", "X-CSRF-Token": csrf}


@contextlib.asynccontextmanager
async def serving(settings: Settings, *, mailer: Any = None) -> AsyncIterator[Env]:
    """The app as the container builds it, on a fake clock; ``mailer`` replaces the one the
    settings select."""
    clock = FakeClock()
    container = build_container(settings, base_url="http://tradecore.test")
    container.core.clock.override(providers.Object(clock))
    container.core.sleeper.override(providers.Object(FakeSleeper(clock)))
    container.core.random.override(providers.Object(SeededRandom(11)))
    container.core.host_settings.override(providers.Object(HostSettings(poll_s=0.005)))
    cheap = argon2.PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    container.shared.hasher.override(providers.Object(Argon2PasswordHasher(hasher=cheap)))
    if mailer is not None:
        container.shared.mailer.override(providers.Object(mailer))
    server = TestServer(make_app(container))
    await server.start_server(**runner_options())
    client: TestClient[Any, Any] = TestClient(server, cookie_jar=DummyCookieJar())
    await client.start_server()
    try:
        yield Env(client, container, container.services.system(), clock)
    finally:
        await client.close()


@pytest.fixture
async def env(inbox: tuple[Inbox, int]) -> AsyncIterator[Env]:
    async with serving(mail_settings(inbox[1])) as running:
        yield running


# --- alerts ------------------------------------------------------------------------------------


async def test_wrong_secret_is_401_one_entry_and_one_escaped_mail(
    env: Env, inbox: tuple[Inbox, int]
) -> None:
    trader = await env.trader("ada@example.com", HOSTILE_NAME)
    account_id = trader.account.account.id

    response = await trader.attack()

    assert response.status == 401
    (stored,) = env.audit(trader.user.id)
    entry = stored.entry
    assert entry.action is AuditAction.WEBHOOK_CREDENTIAL_ATTACK and entry.success is False
    assert entry.metadata["attack_type"] == "wrong_secret"
    assert entry.metadata["trading_account_id"] == account_id
    assert entry.context.ip_address == ATTACKER_IP
    assert entry.context.user_agent == HOSTILE_AGENT  # stored as sent, rendered escaped
    assert entry.context.request_path == "/webhook/<token>/order"
    for secret in (WRONG_SECRET, trader.account.webhook_secret, trader.account.webhook_token):
        assert secret not in repr(entry)

    await env.drain()
    (mail,) = inbox[0].messages
    assert mail["To"] == "ada@example.com" and mail["From"] == MAIL_FROM
    assert "\n" not in mail["Subject"]
    text, markup = parts(mail)
    when = entry.created_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    description = ATTACK_POLICIES[AuditAction.WEBHOOK_CREDENTIAL_ATTACK].description
    for part, render in ((text, str), (markup, html.escape)):
        assert "webhook_credential_attack" in part
        assert ATTACKER_IP in part
        assert when in part
        assert render(HOSTILE_NAME) in part
        assert render(description) in part
        for secret in (WRONG_SECRET, trader.account.webhook_secret, trader.account.webhook_token):
            assert secret not in part
    assert "<script>" not in markup


async def test_fifty_concurrent_wrong_secrets_give_fifty_entries_and_one_mail(
    env: Env, inbox: tuple[Inbox, int]
) -> None:
    trader = await env.trader("ada@example.com")

    responses = await asyncio.wait_for(
        asyncio.gather(*(trader.attack() for _ in range(50))), WAIT_S
    )
    await env.drain()

    assert [r.status for r in responses] == [401] * 50
    actions = [s.entry.action for s in env.audit(trader.user.id)]
    assert actions == [AuditAction.WEBHOOK_CREDENTIAL_ATTACK] * 50
    assert len(inbox[0].messages) == 1


async def test_second_attack_inside_thirty_minutes_mails_nothing_and_after_it_mails(
    env: Env, inbox: tuple[Inbox, int]
) -> None:
    trader = await env.trader("ada@example.com")

    assert (await trader.attack()).status == 401
    await env.drain()
    env.clock.advance(29 * 60)
    assert (await trader.attack()).status == 401
    await env.drain()
    first, second = (s.entry.created_at for s in env.audit(trader.user.id))
    assert second - first < timedelta(minutes=30)
    assert len(inbox[0].messages) == 1

    env.clock.advance(61)
    assert (await trader.attack()).status == 401
    await env.drain()
    assert env.audit(trader.user.id)[-1].entry.created_at - first >= timedelta(minutes=30)
    assert len(inbox[0].messages) == 2


async def test_ip_blocked_webhook_is_403_audited_and_mailed(
    env: Env, inbox: tuple[Inbox, int]
) -> None:
    trader = await env.trader("ada@example.com")
    await env.system.allowed_ips.add(
        AllowedIp("ip-1", trader.user.id, "192.0.2.10", env.clock.now())
    )

    response = await trader.webhook()

    assert response.status == 403
    (stored,) = env.audit(trader.user.id)
    assert stored.entry.action is AuditAction.WEBHOOK_IP_BLOCKED
    assert stored.entry.metadata["trading_account_id"] == trader.account.account.id
    assert stored.entry.context.ip_address == ATTACKER_IP
    await env.drain()
    (mail,) = inbox[0].messages
    text, markup = parts(mail)
    assert "webhook_ip_blocked" in text and ATTACKER_IP in text and "Main" in text
    assert "webhook_ip_blocked" in markup


async def test_csrf_failure_is_403_audited_without_mail(env: Env, inbox: tuple[Inbox, int]) -> None:
    trader = await env.trader("ada@example.com")
    headers = await env.login("ada@example.com")
    before = len(env.audit(trader.user.id))

    response = await env.client.post(
        "/settings/allowed-ips",
        json={"ip_address": "192.0.2.10"},
        headers={"Cookie": headers["Cookie"], "X-CSRF-Token": "forged"},
    )

    assert response.status == 403
    (stored,) = env.audit(trader.user.id)[before:]
    assert stored.entry.action is AuditAction.CSRF_VALIDATION_FAILED
    assert "forged" not in repr(stored.entry) and headers["X-CSRF-Token"] not in repr(stored.entry)
    await env.drain()
    assert inbox[0].messages == []
    assert await env.system.allowed_ips.list_for_user(trader.user.id) == []


# --- mail server faults --------------------------------------------------------------------------


async def test_mail_server_down_changes_nothing_for_the_requests(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serving(mail_settings(free_port())) as env:  # nothing listens there
        trader = await env.trader("ada@example.com")
        with caplog.at_level(logging.ERROR):
            wrong_secret = await trader.attack()
            await env.system.allowed_ips.add(
                AllowedIp("ip-1", trader.user.id, "192.0.2.10", env.clock.now())
            )
            blocked = await trader.webhook()
            await env.drain()

        assert (wrong_secret.status, blocked.status) == (401, 403)
        assert [s.entry.action for s in env.audit(trader.user.id)] == [
            AuditAction.WEBHOOK_CREDENTIAL_ATTACK,
            AuditAction.WEBHOOK_IP_BLOCKED,
        ]
        assert any("not sent" in r.getMessage() for r in caplog.records)
        # a mail that never reached a server spends no alert slot
        assert await env.system.throttle.try_claim(trader.user.id, 1800)


async def test_hanging_mail_server_never_holds_the_answer(
    silent: tuple[SilentServer, int],
) -> None:
    server, port = silent
    async with serving(mail_settings(port)) as env:
        trader = await env.trader("ada@example.com")

        response = await asyncio.wait_for(trader.attack(), WAIT_S)

        # answered while the mail is still waiting for the server's greeting
        assert response.status == 401
        await asyncio.wait_for(server.connected.wait(), WAIT_S)
        (reader, _) = server.connections[0]
        assert not reader.at_eof()
        assert [s.entry.action for s in env.audit(trader.user.id)] == [
            AuditAction.WEBHOOK_CREDENTIAL_ATTACK
        ]
        server.hang_up()
        await env.drain()


async def test_mail_timeout_ends_a_hanging_send_and_frees_the_slot(
    silent: tuple[SilentServer, int],
) -> None:
    server, port = silent
    quick = SmtpMailer(SmtpSettings("127.0.0.1", port), MAIL_FROM, timeout_s=0.2)
    async with serving(mail_settings(port), mailer=quick) as env:
        trader = await env.trader("ada@example.com")

        assert (await trader.attack()).status == 401
        await env.drain()  # returns although the server never answers

        assert server.connected.is_set()
        assert await env.system.throttle.try_claim(trader.user.id, 1800)


# --- GET /settings/security-attacks -----------------------------------------------------------


async def attack_report(env: Env, headers: dict[str, str], query: str = "") -> dict[str, Any]:
    response = await env.client.get(
        f"/settings/security-attacks{query}", headers={"Cookie": headers["Cookie"]}
    )
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def test_security_attacks_shows_counts_items_and_accounts_of_the_user_only(
    env: Env,
) -> None:
    ada = await env.trader("ada@example.com", "Main")
    second = await env.account(ada.user, HOSTILE_NAME)
    bob = await env.trader("bob@example.com", "Bob's account")
    ada_on_second = Trader(env, ada.user, second)

    assert (await ada.attack()).status == 401
    stale = (env.clock.now() - timedelta(minutes=10)).isoformat()
    assert (await ada.webhook(ada.body(timestamp=stale))).status == 401
    order = ada.body(quantity=2)
    assert (await ada.webhook(order)).status == 200
    assert (await ada.webhook(order)).status == 409
    for _ in range(3):
        assert (await bob.attack()).status == 401
    assert (await ada_on_second.attack(quantity=3)).status == 401
    headers = await env.login("ada@example.com")
    csrf = await env.client.delete("/settings/api-keys/k", headers={"Cookie": headers["Cookie"]})
    assert csrf.status == 403

    report = await attack_report(env, headers)

    assert report["counts"] == {
        "webhook_ip_blocked": 0,
        "webhook_timestamp_expired": 1,
        "webhook_credential_attack": 2,
        "webhook_replay_attack": 1,
        "webhook_payload_invalid": 0,
        "csrf_validation_failed": 1,
        "login_credential_attack": 0,
    }
    assert (report["total"], report["page"], report["page_size"]) == (5, 1, 20)
    items = report["items"]
    assert [i["action"] for i in items] == [
        "csrf_validation_failed",
        "webhook_credential_attack",
        "webhook_replay_attack",
        "webhook_timestamp_expired",
        "webhook_credential_attack",
    ]
    assert [i["id"] for i in items] == sorted((i["id"] for i in items), reverse=True)
    newest_attack = items[1]
    assert newest_attack["trading_account_id"] == second.account.id
    assert newest_attack["ip_address"] == ATTACKER_IP
    assert newest_attack["user_agent"] == HOSTILE_AGENT
    assert newest_attack["request_path"] == "/webhook/<token>/order"
    assert newest_attack["metadata"]["attack_type"] == "wrong_secret"
    assert newest_attack["created_at"].endswith("Z")
    assert items[2]["metadata"]["payload_hash"]
    assert items[0]["trading_account_id"] is None
    assert report["affected_accounts"] == [
        {"trading_account_id": second.account.id, "name": HOSTILE_NAME, "events": 1},
        {"trading_account_id": ada.account.account.id, "name": "Main", "events": 3},
    ]
    text = json.dumps(report)
    assert bob.account.account.id not in text and bob.user.id not in text
    for secret in (WRONG_SECRET, ada.account.webhook_secret, ada.account.webhook_token):
        assert secret not in text

    bobs = await attack_report(env, await env.login("bob@example.com"))
    assert bobs["total"] == 3 and bobs["counts"]["webhook_credential_attack"] == 3
    assert {i["trading_account_id"] for i in bobs["items"]} == {bob.account.account.id}
    assert [a["name"] for a in bobs["affected_accounts"]] == ["Bob's account"]


async def test_security_attacks_pages_without_overlap(env: Env) -> None:
    trader = await env.trader("ada@example.com")
    for n in range(5):
        assert (await trader.attack(quantity=n + 1)).status == 401
    headers = await env.login("ada@example.com")

    pages = [await attack_report(env, headers, f"?page={p}&page_size=2") for p in (1, 2, 3, 4)]

    assert [len(p["items"]) for p in pages] == [2, 2, 1, 0]
    ids = [i["id"] for p in pages for i in p["items"]]
    assert len(set(ids)) == 5 and ids == sorted(ids, reverse=True)
    assert {p["total"] for p in pages} == {5}
    assert {p["counts"]["webhook_credential_attack"] for p in pages} == {5}


async def test_security_attacks_counts_are_exact_beyond_a_thousand_events(env: Env) -> None:
    trader = await env.trader("ada@example.com")
    context = RequestContext(ATTACKER_IP, "scanner", "/webhook/<token>/order", "POST")
    flood = ACCOUNT_COUNT_LIMIT + 5
    for _ in range(flood):
        await env.system.audit.append(
            AuditEntry(
                user_id=trader.user.id,
                action=AuditAction.WEBHOOK_CREDENTIAL_ATTACK,
                success=False,
                context=context,
                created_at=env.clock.now(),
                metadata={"attack_type": "wrong_secret", "trading_account_id": "not-hers"},
            )
        )
    assert (await trader.webhook(trader.body(timestamp="2020-01-01T00:00:00Z"))).status == 401
    headers = await env.login("ada@example.com")

    report = await attack_report(env, headers, "?page_size=1")

    assert report["counts"]["webhook_credential_attack"] == flood
    assert report["counts"]["webhook_timestamp_expired"] == 1
    assert report["total"] == flood + 1
    # too many events to count per account; an id that is not one of hers is not named
    assert report["affected_accounts"] == [
        {"trading_account_id": trader.account.account.id, "name": "Main", "events": None},
        {"trading_account_id": "not-hers", "name": None, "events": None},
    ]


async def test_security_attacks_window_follows_days(env: Env) -> None:
    trader = await env.trader("ada@example.com")
    assert (await trader.attack()).status == 401
    env.clock.advance(8 * 86400)
    headers = await env.login("ada@example.com")

    assert (await attack_report(env, headers, "?days=7"))["total"] == 0
    assert (await attack_report(env, headers, "?days=9"))["total"] == 1


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("?page=0", "page"),
        ("?page=-1", "page"),
        ("?page=1.5", "page"),
        ("?page=", "page"),
        (f"?page={MAX_PAGE + 1}", "page"),
        ("?page_size=0", "page_size"),
        (f"?page_size={MAX_PAGE_SIZE + 1}", "page_size"),
        ("?page_size=ten", "page_size"),
        ("?days=0", "days"),
        (f"?days={MAX_DAYS + 1}", "days"),
        ("?days=%207", "days"),
        ("?days=%D9%A3", "days"),  # an Arabic-Indic digit is a digit, not an ASCII one
    ],
)
async def test_security_attacks_refuses_nonsense_queries_with_400(
    env: Env, query: str, name: str
) -> None:
    await env.trader("ada@example.com")
    headers = await env.login("ada@example.com")

    response = await env.client.get(
        f"/settings/security-attacks{query}", headers={"Cookie": headers["Cookie"]}
    )

    assert response.status == 400
    assert response.headers["Content-Type"].startswith("application/problem+json")
    assert (await response.json())["detail"].startswith(f"{name} must be an integer")


async def test_security_attacks_needs_a_principal(env: Env) -> None:
    assert (await env.client.get("/settings/security-attacks")).status == 401


@given(
    page=st.one_of(st.none(), st.integers(-5, MAX_PAGE + 5), st.text(max_size=8)),
    page_size=st.one_of(st.none(), st.integers(-5, MAX_PAGE_SIZE + 5), st.text(max_size=4)),
    days=st.one_of(st.none(), st.integers(-5, MAX_DAYS + 5), st.booleans()),
)
def test_query_is_accepted_exactly_when_every_value_is_in_range(
    page: object, page_size: object, days: object
) -> None:
    def value(raw: object, default: int, highest: int) -> int | None:
        if raw is None:
            return default
        if isinstance(raw, bool):
            return None
        if isinstance(raw, str):
            if not (raw.isascii() and raw.isdigit()) or len(raw) > 6:
                return None
            raw = int(raw)
        assert isinstance(raw, int)
        return raw if 1 <= raw <= highest else None

    expected = (
        value(page, 1, MAX_PAGE),
        value(page_size, 20, MAX_PAGE_SIZE),
        value(days, 30, MAX_DAYS),
    )

    parsed = parse_report_query(page, page_size, days)

    if None in expected:
        assert isinstance(parsed, Rejected) and parsed.status == 400
    else:
        assert parsed == ReportQuery(*expected)  # type: ignore[arg-type]


# --- SMTP configuration --------------------------------------------------------------------------


def test_smtp_url_selects_the_smtp_mailer_and_bad_settings_are_one_line() -> None:
    settings = Settings.from_env(
        {"SMTP_URL": "smtp://mail.example.com:2525", "MAIL_FROM": MAIL_FROM}
    )
    assert isinstance(build_container(settings).shared.mailer(), SmtpMailer)
    embedded = build_container(Settings.from_env({}))
    assert embedded.shared.mailer() is embedded.shared.outbox()  # the logging outbox
    for env, reason in (
        ({"SMTP_URL": "http://mail.example.com", "MAIL_FROM": MAIL_FROM}, "smtp:// or smtps://"),
        ({"SMTP_URL": "smtp://mail.example.com:port", "MAIL_FROM": MAIL_FROM}, "invalid port"),
        ({"SMTP_URL": "smtp://mail.example.com"}, "MAIL_FROM is required"),
        ({"MAIL_FROM": "alerts@example.com\r\nBcc: x@example.com"}, "MAIL_FROM must be"),
    ):
        with pytest.raises(ConfigError, match=reason) as refused:
            Settings.from_env(env)
        assert "\n" not in str(refused.value)

    result = CliRunner().invoke(
        main, ["serve"], env={"SMTP_URL": "smtps://user:hunter2@:465", "MAIL_FROM": MAIL_FROM}
    )
    assert result.exit_code == 2
    assert result.output.strip() == "tradecore: SMTP_URL has no host"
    assert "hunter2" not in result.output

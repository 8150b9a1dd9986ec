"""The composition root and the command line: settings from the environment, one-line
refusals, the admin operations, ``serve --demo``."""

from __future__ import annotations

import asyncio
import json
import socket
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner
from dependency_injector import providers
from http_support import fast_hasher

from tradecore_entrypoints.admin import admin_create_account, admin_create_user, seed_demo
from tradecore_entrypoints.cli import main, serve_forever
from tradecore_entrypoints.container import build_container
from tradecore_entrypoints.settings import ConfigError, Settings

STRONG = "x" * 32
KEY = "A" * 43  # 32 bytes of URL-safe base64


def test_defaults_are_the_embedded_development_runtime() -> None:
    settings = Settings.from_env({})
    assert settings.runtime == "embedded"
    assert settings.production is False
    assert settings.captcha_enabled is False
    assert settings.allowed_origins == frozenset({"http://localhost:5173"})
    order = settings.order_settings()
    assert order.webhook_wait_s == 2.5 and order.order_wait_s == 30.0
    assert settings.base_url("127.0.0.1", 8080) == "http://127.0.0.1:8080"


def test_environment_names_of_the_contract_are_read() -> None:
    settings = Settings.from_env(
        {
            "ACCESS_TOKEN_EXPIRE_MINUTES": "15",
            "REFRESH_TOKEN_EXPIRE_DAYS": "7",
            "COOKIE_DOMAIN": "example.com",
            "ALLOWED_ORIGINS": "https://app.example.com, http://localhost:5173",
            "TRUSTED_PROXIES": "10.0.0.0/8",
            "PUBLIC_BASE_URL": "https://hooks.example.com/",
            "ORDER_RESPONSE_WAIT_S": "10",
            "WEBHOOK_RESPONSE_WAIT_S": "1.5",
            "RATE_LIMIT_PER_MINUTE": "30",
            "PLAN_DAILY_ORDER_CAPS": "free=5,pro=50",
            "TERMS_VERSION": "2",
            "WORKER_IDLE_TIMEOUT_S": "60",
        }
    )
    config = settings.http_config(settings.base_url())
    assert config.cookie_domain == "example.com"
    assert config.access_ttl.total_seconds() == 900
    assert config.allowed_origins == {"https://app.example.com", "http://localhost:5173"}
    assert config.public_base_url == "https://hooks.example.com"
    assert settings.order_settings().rate_limit_per_minute == 30
    assert settings.host_settings().idle_timeout_s == 60
    assert settings.auth_settings().refresh_ttl.days == 7


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"TRADECORE_ENV": "production"}, "JWT_SECRET"),
        ({"TRADECORE_ENV": "production", "JWT_SECRET": "short"}, "JWT_SECRET"),
        ({"JWT_SECRET": "short"}, "JWT_SECRET"),
        ({"TRADECORE_ENV": "production", "JWT_SECRET": STRONG}, "ENCRYPTION_KEY"),
        (
            {"TRADECORE_ENV": "production", "JWT_SECRET": STRONG, "ENCRYPTION_KEY": "abc"},
            "ENCRYPTION_KEY",
        ),
        (
            {"TRADECORE_ENV": "production", "JWT_SECRET": STRONG, "ENCRYPTION_KEY": KEY},
            "TURNSTILE_SECRET",
        ),
        ({"TRADECORE_ENV": "staging"}, "TRADECORE_ENV"),
        ({"TRUSTED_PROXIES": "10.0.0.1/8"}, "TRUSTED_PROXIES"),
        ({"ALLOWED_ORIGINS": "*"}, "ALLOWED_ORIGINS"),
        ({"ALLOWED_ORIGINS": "https://app.example.com/path"}, "ALLOWED_ORIGINS"),
        ({"CAPTCHA_ENABLED": "maybe"}, "CAPTCHA_ENABLED"),
        ({"RATE_LIMIT_PER_MINUTE": "-1"}, "RATE_LIMIT_PER_MINUTE"),
        ({"PLAN_DAILY_ORDER_CAPS": "free=1"}, "PLAN_DAILY_ORDER_CAPS"),
        ({"DATABASE_URL": "mysql://x"}, "DATABASE_URL"),
        ({"PUBLIC_BASE_URL": "ftp://x"}, "PUBLIC_BASE_URL"),
    ],
)
def test_bad_configuration_is_refused_with_a_one_line_reason(
    env: dict[str, str], names: str
) -> None:
    with pytest.raises(ConfigError) as error:
        Settings.from_env(env)
    message = str(error.value)
    assert names in message and "\n" not in message


def test_production_with_everything_set_is_accepted() -> None:
    settings = Settings.from_env(
        {
            "TRADECORE_ENV": "production",
            "JWT_SECRET": STRONG,
            "ENCRYPTION_KEY": KEY,
            "TURNSTILE_SECRET": "t",
            "ALLOWED_ORIGINS": "https://app.example.com",
        }
    )
    assert settings.production and settings.captcha_enabled
    assert "x" * 32 not in repr(settings)


def test_database_url_without_redis_url_is_refused() -> None:
    settings = Settings.from_env(
        {"DATABASE_URL": "postgresql://db/x", "JWT_SECRET": STRONG, "ENCRYPTION_KEY": KEY}
    )
    with pytest.raises(ConfigError, match="DATABASE_URL and REDIS_URL go together"):
        build_container(settings)


def test_cli_serve_exits_2_with_one_line_on_bad_config() -> None:
    result = CliRunner().invoke(main, ["serve"], env={"TRADECORE_ENV": "production"})
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert "JWT_SECRET" in result.output


def test_cli_admin_is_refused_in_the_embedded_runtime() -> None:
    result = CliRunner().invoke(
        main, ["admin", "revoke-sessions", "--email", "a@example.com"], env={}
    )
    assert result.exit_code == 2
    assert "DATABASE_URL" in result.output


async def test_admin_operations_over_the_container() -> None:
    container = build_container(Settings(), base_url="https://hooks.example.com")
    container.shared.hasher.override(providers.Object(fast_hasher()))
    created = await admin_create_user(container, "ops@example.com", "long enough pw", "pro", True)
    user = await container.services.system().users.get(created["user_id"])
    assert user is not None and user.accepted_terms_version == "1"
    account = await admin_create_account(container, "ops@example.com", "Main", "paper", True)
    assert account["webhook_url"] == (
        f"https://hooks.example.com/webhook/{account['webhook_token']}/order"
    )
    with pytest.raises(ValueError, match="no user"):
        await admin_create_account(container, "nobody@example.com", "Main", "paper", True)


async def test_demo_seed_is_a_ready_pro_user_with_a_verified_account() -> None:
    container = build_container(Settings(), base_url="http://127.0.0.1:8080")
    container.shared.hasher.override(providers.Object(fast_hasher()))
    line = await seed_demo(container)
    assert set(line) == {
        "dashboard_url",
        "email",
        "password",
        "webhook_url",
        "webhook_secret",
        "trading_account_id",
    }
    assert line["dashboard_url"] == "http://127.0.0.1:8080/"
    system = container.services.system()
    user = await system.users.by_email(line["email"])
    assert user is not None and user.plan.value == "pro" and user.accepted_terms_version == "1"
    account = await system.accounts.get(line["trading_account_id"])
    assert account is not None and account.credentials_verified


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_serve_demo_prints_one_line_and_serves_a_webhook() -> None:
    lines: list[str] = []
    stop = asyncio.Event()
    printed = asyncio.Event()

    def echo(text: str) -> Any:
        lines.append(text)
        printed.set()

    port = _free_port()
    server = asyncio.create_task(
        serve_forever(Settings(), "127.0.0.1", port, demo=True, echo=echo, stop=stop)
    )
    try:
        await asyncio.wait_for(printed.wait(), 30)
        assert len(lines) == 1
        demo = json.loads(lines[0])
        assert demo["webhook_url"].startswith(f"http://127.0.0.1:{port}/webhook/")
        body = {
            "action": "buy",
            "symbol": "BTCUSDT",
            "quantity": 1,
            "timestamp": datetime.now(UTC).isoformat(),
            "secret": demo["webhook_secret"],
        }
        async with aiohttp.ClientSession() as client:
            async with client.post(demo["webhook_url"], json=body) as response:
                assert response.status == 200
                assert (await response.json())["status"] == "filled"
            async with client.post(
                f"http://127.0.0.1:{port}/auth/login",
                json={"email": demo["email"], "password": demo["password"]},
            ) as response:
                assert response.status == 200
        # a new visitor, without cookies
        async with aiohttp.ClientSession() as browser, browser.get(demo["dashboard_url"]) as page:
            assert page.status == 200 and page.url.path == "/ui/login"
            assert "Log in" in await page.text()
    finally:
        stop.set()
        await asyncio.wait_for(server, 30)

"""What the ``tradecore admin`` commands and ``serve --demo`` do, over a container (async,
so tests drive them directly). Bad input raises ValueError with a one-line reason."""

from __future__ import annotations

import secrets
from typing import Any

from tradecore.audit import RequestContext
from tradecore.identity import Plan, User
from tradecore.sessions import normalize_email
from tradecore_entrypoints.container import Application
from tradecore_entrypoints.settings import Settings
from tradecore_entrypoints.system import System

DEMO_EMAIL = "demo@example.com"
ADMIN_CONTEXT = RequestContext(
    ip_address="127.0.0.1", user_agent="tradecore-cli", request_path="cli", request_method="CLI"
)


def _system(container: Application) -> System:
    system: System = container.services.system()
    return system


async def _user_by_email(container: Application, email: str) -> User:
    normalized = normalize_email(email)
    user = None if normalized is None else await _system(container).users.by_email(normalized)
    if user is None:
        raise ValueError(f"no user with e-mail {email!r}")
    return user


async def admin_create_user(
    container: Application,
    email: str,
    password: str,
    plan: str,
    accept_terms: bool,
    *,
    admin: bool = False,
) -> dict[str, Any]:
    """``admin create-user``: ``{"user_id"}``; an administrator with ``admin``."""
    settings: Settings = container.core.settings()
    user = await _system(container).provisioning.create_user(
        email,
        password,
        plan=Plan(plan),
        terms_version=settings.terms_version if accept_terms else None,
        admin=admin,
    )
    return {"user_id": user.id}


async def admin_create_account(
    container: Application, email: str, name: str, broker: str, verified: bool
) -> dict[str, Any]:
    """``admin create-account``: id, webhook URL, token and secret (shown this once)."""
    user = await _user_by_email(container, email)
    new = await _system(container).provisioning.create_account(
        user, name, broker_name=broker, credentials_verified=verified
    )
    return {
        "trading_account_id": new.account.id,
        "webhook_url": new.webhook_url(container.core.base_url()),
        "webhook_token": new.webhook_token,
        "webhook_secret": new.webhook_secret,
    }


async def admin_revoke_sessions(container: Application, email: str) -> dict[str, Any]:
    """``admin revoke-sessions``: the administrative revocation; ``{"sessions_revoked"}``."""
    user = await _user_by_email(container, email)
    lifetime = container.services.session_lifetime()
    revoked = await lifetime.revoke_all_sessions(user.id, ADMIN_CONTEXT)
    return {"user_id": user.id, "sessions_revoked": revoked}


async def seed_demo(container: Application) -> dict[str, str]:
    """The ``--demo`` user (plan pro, terms accepted) and its verified paper account, as the
    JSON line ``serve --demo`` prints: the dashboard's address first, then the credentials
    to log in with, then the account's webhook URL and secret."""
    settings: Settings = container.core.settings()
    system = _system(container)
    password = secrets.token_urlsafe(18)
    user = await system.provisioning.create_user(
        DEMO_EMAIL, password, plan=Plan.PRO, terms_version=settings.terms_version
    )
    new = await system.provisioning.create_account(
        user, "Demo paper account", credentials_verified=True
    )
    base_url = container.core.base_url()
    return {
        "dashboard_url": f"{base_url}/",
        "email": user.email,
        "password": password,
        "webhook_url": new.webhook_url(base_url),
        "webhook_secret": new.webhook_secret,
        "trading_account_id": new.account.id,
    }

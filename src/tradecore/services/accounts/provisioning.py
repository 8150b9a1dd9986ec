"""Creating users and trading accounts, and rotating a webhook's token and secret.

The webhook token (in the URL) and secret (in the body) are 32-byte URL-safe random strings.
They are returned once, here, and stored only as SHA-256 digests.
"""

from __future__ import annotations

from decimal import Decimal

import attrs

from tradecore.account_rules import MAX_NAME_CHARS
from tradecore.accounts import DEFAULT_MAX_REQUEST_AGE_S, TradingAccount
from tradecore.identity import Plan, User
from tradecore.ports.identity import PasswordHasher
from tradecore.ports.repositories import TradingAccountRepository, UserRepository
from tradecore.ports.runtime import Clock, RandomSource
from tradecore.sessions import normalize_email, validate_password
from tradecore.webhooks.checks import hash_secret

WEBHOOK_TOKEN_BYTES = 32
WEBHOOK_SECRET_BYTES = 32


class ProvisioningError(ValueError):
    """The request cannot be carried out; the message is safe to show."""


@attrs.frozen
class NewAccount:
    """A created account with its webhook token and secret, shown this once."""

    account: TradingAccount
    webhook_token: str = attrs.field(repr=False)
    webhook_secret: str = attrs.field(repr=False)

    def webhook_url(self, base_url: str) -> str:
        return webhook_url(base_url, self.webhook_token)


def webhook_url(base_url: str, token: str) -> str:
    """The per-account URL alerts are posted to."""
    return f"{base_url.rstrip('/')}/webhook/{token}/order"


class Provisioning:
    """User and trading-account creation."""

    def __init__(
        self,
        users: UserRepository,
        accounts: TradingAccountRepository,
        hasher: PasswordHasher,
        clock: Clock,
        random: RandomSource,
    ) -> None:
        self._users = users
        self._accounts = accounts
        self._hasher = hasher
        self._clock = clock
        self._random = random

    async def create_user(
        self,
        email: str,
        password: str,
        *,
        plan: Plan = Plan.FREE,
        terms_version: str | None = None,
        admin: bool = False,
    ) -> User:
        """A new user (an administrator with ``admin``); raises ProvisioningError on a bad
        e-mail or password or a taken e-mail."""
        normalized = normalize_email(email)
        if normalized is None:
            raise ProvisioningError("invalid e-mail address")
        problem = validate_password(password)
        if problem is not None:
            raise ProvisioningError(problem)
        user = User(
            id=self._random.new_id(),
            email=normalized,
            password_hash=await self._hasher.hash(password),
            plan=plan,
            created_at=self._clock.now(),
            accepted_terms_version=terms_version,
            is_admin=admin,
        )
        if not await self._users.add(user):
            raise ProvisioningError("e-mail address already registered")
        return user

    async def create_account(
        self,
        user: User,
        name: str,
        *,
        broker_name: str = "paper",
        credentials_verified: bool = False,
        allowed_symbols: frozenset[str] = frozenset(),
        max_request_age: int = DEFAULT_MAX_REQUEST_AGE_S,
        max_quantity: Decimal = Decimal(1_000_000),
    ) -> NewAccount:
        """A new trading account of ``user`` with a fresh webhook token and secret, stored."""
        new = self.draft_account(
            user,
            name,
            broker_name=broker_name,
            credentials_verified=credentials_verified,
            allowed_symbols=allowed_symbols,
            max_request_age=max_request_age,
            max_quantity=max_quantity,
        )
        await self._accounts.add(new.account)
        return new

    def draft_account(
        self,
        user: User,
        name: str,
        *,
        broker_name: str = "paper",
        credentials_verified: bool = False,
        allowed_symbols: frozenset[str] = frozenset(),
        max_request_age: int = DEFAULT_MAX_REQUEST_AGE_S,
        max_quantity: Decimal = Decimal(1_000_000),
    ) -> NewAccount:
        """A new account with its id, webhook token and secret, not yet stored (the caller
        adds what it needs, such as credentials bound to the id, then stores it)."""
        clean_name = name.strip()
        if not 1 <= len(clean_name) <= MAX_NAME_CHARS:
            raise ProvisioningError(f"account name must be 1 to {MAX_NAME_CHARS} characters")
        token = self._random.token_urlsafe(WEBHOOK_TOKEN_BYTES)
        secret = self._random.token_urlsafe(WEBHOOK_SECRET_BYTES)
        account = TradingAccount(
            id=self._random.new_id(),
            user_id=user.id,
            name=clean_name,
            broker_name=broker_name,
            webhook_token_hash=hash_secret(token),
            webhook_secret_hash=hash_secret(secret),
            created_at=self._clock.now(),
            max_request_age=max_request_age,
            allowed_symbols=allowed_symbols,
            max_quantity=max_quantity,
            credentials_verified=credentials_verified,
        )
        return NewAccount(account, token, secret)

    async def regenerate_secret(self, account: TradingAccount) -> str | None:
        """Replace the webhook secret of ``account`` (as the caller read it); the new one is
        returned this once. None, and nothing written, when the stored secret is no longer the
        one ``account`` holds or the account was deleted meanwhile: a regeneration never
        writes over a secret it has not seen."""
        secret = self._random.token_urlsafe(WEBHOOK_SECRET_BYTES)
        updated = attrs.evolve(account, webhook_secret_hash=hash_secret(secret))
        stored = await self._accounts.save(updated, previous=account)
        return None if stored is None else secret

    async def rotate_token(self, account: TradingAccount) -> str | None:
        """Replace the webhook URL token of ``account`` (as the caller read it); the old URL
        stops working at once. None, and nothing written, when the stored token is no longer
        the one ``account`` holds or the account was deleted meanwhile."""
        token = self._random.token_urlsafe(WEBHOOK_TOKEN_BYTES)
        updated = attrs.evolve(account, webhook_token_hash=hash_secret(token))
        stored = await self._accounts.save(updated, previous=account)
        return None if stored is None else token

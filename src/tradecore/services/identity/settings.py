"""The identity flows' settings: token lifetimes, the bot challenge, the sign-in throttles."""

from __future__ import annotations

from datetime import timedelta

import attrs

from tradecore.sessions import ACCESS_TOKEN_EXPIRE_MINUTES, REFRESH_TOKEN_EXPIRE_DAYS


def _positive(_: object, attribute: attrs.Attribute[timedelta], value: timedelta) -> None:
    if value <= timedelta(0):
        raise ValueError(f"{attribute.name} must be positive")


@attrs.frozen
class AuthSettings:
    """Token lifetimes, the bot challenge, and the throttles of the sign-in flows.

    ``captcha_bypass_user_agents`` is an explicit list of exact User-Agent values (security
    scanners) that skip the challenge; empty by default.

    The throttles count within ``throttle_window_s`` (docs/security.md, "Login throttling"):
    ``login_failures_per_ip`` failed logins and password grants per client address;
    ``login_failures_per_account_ip`` failed ones per account from one address (so an
    attacker elsewhere cannot lock the owner out); ``token_grant_failures_per_account``
    failed password grants per account from any address (the grant has no bot challenge;
    ``/auth/login`` with the challenge stays open to the owner); ``register_attempts_per_ip``
    and ``forgot_password_attempts_per_ip`` requests per client address.
    """

    access_ttl: timedelta = attrs.field(
        default=timedelta(minutes=ACCESS_TOKEN_EXPIRE_MINUTES), validator=_positive
    )
    refresh_ttl: timedelta = attrs.field(
        default=timedelta(days=REFRESH_TOKEN_EXPIRE_DAYS), validator=_positive
    )
    captcha_enabled: bool = True
    captcha_bypass_user_agents: frozenset[str] = attrs.field(
        default=frozenset(), converter=frozenset
    )
    throttle_window_s: float = attrs.field(default=900.0, validator=attrs.validators.gt(0))
    login_failures_per_ip: int = attrs.field(default=10, validator=attrs.validators.ge(1))
    login_failures_per_account_ip: int = attrs.field(default=5, validator=attrs.validators.ge(1))
    token_grant_failures_per_account: int = attrs.field(
        default=10, validator=attrs.validators.ge(1)
    )
    register_attempts_per_ip: int = attrs.field(default=10, validator=attrs.validators.ge(1))
    forgot_password_attempts_per_ip: int = attrs.field(default=10, validator=attrs.validators.ge(1))

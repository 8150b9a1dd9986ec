"""The identity flows' settings: token lifetimes, the bot challenge, the password-grant limit."""

from __future__ import annotations

from datetime import timedelta

import attrs

from tradecore.sessions import ACCESS_TOKEN_EXPIRE_MINUTES, REFRESH_TOKEN_EXPIRE_DAYS


def _positive(_: object, attribute: attrs.Attribute[timedelta], value: timedelta) -> None:
    if value <= timedelta(0):
        raise ValueError(f"{attribute.name} must be positive")


@attrs.frozen
class AuthSettings:
    """Token lifetimes, the bot challenge, and the ``/auth/token`` password-grant limit.

    ``captcha_bypass_user_agents`` is an explicit list of exact User-Agent values (security
    scanners) that skip the challenge; empty by default. ``token_grant_attempts`` password
    grants are admitted per e-mail address and per client IP in ``token_grant_window_s``: the
    grant has no bot challenge, so this is what stands between it and password guessing.
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
    token_grant_attempts: int = 10
    token_grant_window_s: float = 900.0

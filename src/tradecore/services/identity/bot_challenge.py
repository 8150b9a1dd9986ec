"""The bot challenge of login and register (Turnstile through a ``CaptchaVerifier``)."""

from __future__ import annotations

import logging

from tradecore.audit import RequestContext
from tradecore.ports.identity import CaptchaVerifier
from tradecore.services.identity.refusals import CAPTCHA_FAILED
from tradecore.services.vocabulary import Rejected, bad_request

log = logging.getLogger(__name__)


class BotChallenge:
    """The bot challenge of login and register: on when enabled, except for the User-Agents
    of the bypass list."""

    def __init__(
        self, verifier: CaptchaVerifier, *, enabled: bool, bypass_user_agents: frozenset[str]
    ) -> None:
        self._verifier = verifier
        self._enabled = enabled
        self._bypass = bypass_user_agents

    def applies(self, context: RequestContext) -> bool:
        return self._enabled and context.user_agent not in self._bypass

    def bypassed(self, context: RequestContext) -> bool:
        """True when the challenge is on but this User-Agent skipped it (audited)."""
        return self._enabled and context.user_agent in self._bypass

    async def check(self, token: object, context: RequestContext) -> Rejected | None:
        """None when the request may proceed; 400 without a token, 403 when refused. A
        verifier that raises counts as a refusal."""
        if not self.applies(context):
            return None
        if not isinstance(token, str) or not token:
            return bad_request("turnstile_token is required")
        try:
            passed = await self._verifier.verify(token, context.ip_address)
        except Exception:
            log.exception("bot challenge verifier failed; refusing")
            passed = False
        return None if passed is True else CAPTCHA_FAILED

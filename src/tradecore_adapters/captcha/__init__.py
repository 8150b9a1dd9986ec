"""Bot-challenge adapters: Cloudflare Turnstile (``turnstile``) and the switched-off verifier."""

from __future__ import annotations


class DisabledCaptcha:
    """CaptchaVerifier for ``CAPTCHA_ENABLED`` off: every token passes, nothing is sent."""

    async def verify(self, token: str, client_ip: str) -> bool:
        return True

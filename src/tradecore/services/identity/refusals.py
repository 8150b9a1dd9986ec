"""The identity flows' refusals. Each has one body whatever hidden check failed: an unknown
user and a wrong password, or a missing and a revoked credential, cannot be told apart."""

from __future__ import annotations

from tradecore.services.vocabulary import Rejected

INVALID_CREDENTIALS = Rejected(401, "invalid_credentials", "Invalid e-mail or password")
NOT_AUTHENTICATED = Rejected(401, "not_authenticated", "Authentication required")
INVALID_REFRESH = Rejected(401, "invalid_refresh_token", "Session expired; log in again")
USER_DISABLED = Rejected(403, "user_disabled", "This account is disabled")
CAPTCHA_FAILED = Rejected(403, "captcha_failed", "Bot challenge failed")

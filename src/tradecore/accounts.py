"""Trading accounts: the broker connection a webhook URL points at.

The webhook token and secret are shown to the user once and stored only as SHA-256 hex
digests (``webhook_token_hash``, ``webhook_secret_hash``); the secret layer compares the
digest of the presented secret with the stored digest in constant time. Broker credentials are
stored only encrypted (``encrypted_credentials``, AES-GCM bound to the account id).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal

import attrs

DEFAULT_MAX_REQUEST_AGE_S = 300


@attrs.frozen
class TradingAccount:
    """A user's trading account at one broker.

    ``allowed_symbols`` empty means: any symbol the broker lists. ``max_quantity`` bounds one
    order's quantity. ``credentials_verified`` is set when the broker accepted the credentials.
    ``encrypted_credentials`` is the ciphertext of the broker credentials (a JSON object of
    strings) under the ``CredentialCipher`` with the account id as associated data, or None
    when none were given (the paper broker needs none); it never appears in a repr.
    ``testnet`` selects the venue's test or paper environment. ``symbol_map`` maps symbols
    the user's alerts send (canonical) to the venue's ids (``tradecore.instruments``).
    """

    id: str
    user_id: str
    name: str
    broker_name: str
    webhook_token_hash: str
    webhook_secret_hash: str
    created_at: datetime
    max_request_age: int = DEFAULT_MAX_REQUEST_AGE_S
    allowed_symbols: frozenset[str] = frozenset()
    max_quantity: Decimal = Decimal(1_000_000)
    credentials_verified: bool = False
    deleted: bool = False
    encrypted_credentials: bytes | None = attrs.field(default=None, repr=False)
    testnet: bool = False
    symbol_map: Mapping[str, str] = attrs.field(factory=dict, hash=False)

    @property
    def credentials_ref(self) -> str:
        """A name for the stored credentials' version: the first 16 hex digits of the
        ciphertext's SHA-256 (a new upload is a new ciphertext), empty when none are stored.
        Reveals nothing of the credentials."""
        if self.encrypted_credentials is None:
            return ""
        return hashlib.sha256(self.encrypted_credentials).hexdigest()[:16]

"""Broker credentials at rest.

They arrive as a JSON object of strings, either plain (development) or sealed with the
service's public key (``TransportKey``); they are encrypted with the ``CredentialCipher``,
bound to the account id, before anything is stored, and opened only for the account's broker
connection. They never appear in an answer, an audit entry, a log line or a repr.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from tradecore.account_rules import (
    InvalidField,
    credential_fields,
    encode_credentials,
    unsealed_credential_fields,
)
from tradecore.accounts import TradingAccount
from tradecore.ports.crypto import CredentialCipher, DecryptionFailed, TransportKey


class CredentialVault:
    """Reads uploads, seals credentials for storage and opens stored ones."""

    def __init__(self, cipher: CredentialCipher, transport: TransportKey) -> None:
        self._cipher = cipher
        self._transport = transport

    async def uploaded(self, plain: object, sealed: object) -> dict[str, str] | None:
        """The uploaded credentials, None when there are none (absent, null or empty).
        Raises ``InvalidField`` for a malformed upload (both kinds at once included) and
        ``DecryptionFailed`` for a sealed one that does not open with the transport key."""
        if plain is not None and sealed is not None:
            raise InvalidField("send credentials or encrypted_credentials, not both")
        if sealed is not None:
            if not isinstance(sealed, str):
                raise InvalidField("encrypted_credentials must be a string")
            fields = unsealed_credential_fields(await self._transport.unseal(sealed))
        elif plain is not None:
            fields = credential_fields(plain)
        else:
            return None
        return fields or None

    def seal(self, account: TradingAccount, fields: Mapping[str, str] | None) -> bytes | None:
        """What ``account`` stores for ``fields`` (None for none): encrypted and bound to
        the account id."""
        if fields is None:
            return None
        return self._cipher.encrypt(encode_credentials(fields), account.id.encode())

    async def open(self, account: TradingAccount) -> dict[str, str]:
        """The account's broker credentials in clear, for its broker connection (empty when
        none are stored). Raises ``DecryptionFailed`` when they do not open with the cipher
        or do not hold a credentials object."""
        if account.encrypted_credentials is None:
            return {}
        plaintext = self._cipher.decrypt(account.encrypted_credentials, account.id.encode())
        try:
            return credential_fields(json.loads(plaintext.decode("utf-8")))
        except (ValueError, UnicodeDecodeError):
            raise DecryptionFailed("stored credentials are not a credentials object") from None

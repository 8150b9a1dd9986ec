"""Broker credentials: encrypted at rest, sealed in transit, checked at the broker.

* ``CredentialCipher`` encrypts what is stored (AES-GCM with the service's ENCRYPTION_KEY).
* ``TransportKey`` is the service's key pair for credentials in transit: the dashboard seals
  them with the public key, so no proxy or WAF log ever holds them in clear.
* ``KeyStore`` keeps the transport key's (encrypted) private half, so every API process and
  every restart serves the same public key.
* ``CredentialVerifier`` asks the account's broker whether it accepts the credentials.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from tradecore.accounts import TradingAccount
from tradecore.errors import StoreUnavailable, TradecoreError


class DecryptionFailed(TradecoreError):
    """A ciphertext could not be opened: wrong key, wrong associated data, tampered, truncated
    or malformed. The message never holds plaintext or key material."""


class TransportKeyUnavailable(StoreUnavailable):
    """The stored transport key pair cannot be used: it does not open with this process's
    ENCRYPTION_KEY (every process of a deployment must share one) or is malformed. A
    configuration fault, answered like an unreachable store (503)."""


@runtime_checkable
class CredentialCipher(Protocol):
    """Authenticated symmetric encryption of small secrets at rest.

    Every ``encrypt`` uses a fresh nonce, so equal plaintexts give different ciphertexts.
    ``associated_data`` binds a ciphertext to its owner (the trading account id): it is not
    stored in the ciphertext and must be presented again to decrypt.
    """

    def encrypt(self, plaintext: bytes, associated_data: bytes) -> bytes:
        """The ciphertext of ``plaintext`` (self-describing: format, nonce, tag)."""
        ...

    def decrypt(self, ciphertext: bytes, associated_data: bytes) -> bytes:
        """The plaintext; raises ``DecryptionFailed`` for anything ``encrypt`` did not produce
        with this key and this ``associated_data``. Never returns unauthenticated bytes."""
        ...


@runtime_checkable
class TransportKey(Protocol):
    """The service's RSA key pair for credentials in transit (RSA-OAEP-256).

    Every process of one deployment serves the same key. Both methods may raise
    ``StoreUnavailable`` (the key is loaded lazily), ``TransportKeyUnavailable`` among them
    when the stored key cannot be opened with the configured ENCRYPTION_KEY.
    """

    async def public_jwk(self) -> Mapping[str, str]:
        """The public key as a JWK: ``kty`` RSA, ``n``, ``e``, ``alg`` RSA-OAEP-256, ``use``
        enc and ``kid`` (its RFC 7638 thumbprint). Never the private members."""
        ...

    async def unseal(self, sealed: str) -> bytes:
        """The plaintext of ``sealed`` as the client sent it (base64url of an RSA-OAEP-256
        ciphertext, or a JWE compact serialization with ``alg`` RSA-OAEP-256 and ``enc``
        A256GCM); ``DecryptionFailed`` for anything else."""
        ...


@runtime_checkable
class KeyStore(Protocol):
    """Named JSON documents that are written once: key material shared by every process."""

    async def load(self, name: str) -> dict[str, Any] | None:
        """The document stored under ``name``, or None."""
        ...

    async def create_if_absent(self, name: str, document: dict[str, Any]) -> dict[str, Any]:
        """Store ``document`` under ``name`` unless a document is there already; return the
        stored one. Race-safe across processes: of concurrent calls exactly one document
        wins and every caller gets that one. Never replaces an existing document."""
        ...


@runtime_checkable
class CredentialVerifier(Protocol):
    """The broker's verdict on an account's credentials."""

    async def verify(self, account: TradingAccount, credentials: Mapping[str, str]) -> str | None:
        """Connect to ``account.broker_name`` with ``credentials`` (empty when none are
        stored): None when the broker accepted them, else its reason, safe to show to the
        account's owner (it never repeats a credential). Never raises for a refusal."""
        ...

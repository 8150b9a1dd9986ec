"""CredentialCipher on AES-256-GCM (``cryptography``).

A ciphertext is ``version (1 byte) || nonce (12 bytes) || encrypted data || tag (16 bytes)``.
The nonce is 96 random bits from the operating system per message; with one key that bounds
the safe number of messages at about 2**32, far above the credentials a deployment stores.
The version byte leaves room for a later key rotation (a key id in a new format).
"""

from __future__ import annotations

import base64
import os
import re

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tradecore.ports.crypto import DecryptionFailed

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
FORMAT_V1 = b"\x01"
_HEADER = len(FORMAT_V1) + NONCE_BYTES
# 32 bytes are 43 base64 characters (the last one carries 4 bits, so it is one of 16) and one "="
_KEY_TEXT = re.compile(r"[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]=?")


def parse_key(text: str) -> bytes:
    """ENCRYPTION_KEY: URL-safe base64 of exactly 32 bytes, padding optional (what
    ``secrets.token_urlsafe(32)`` prints); ValueError otherwise, naming the rule, never the
    value."""
    stripped = text.strip()
    if _KEY_TEXT.fullmatch(stripped) is None:
        raise ValueError("ENCRYPTION_KEY must be 32 random bytes in URL-safe base64")
    return base64.urlsafe_b64decode(stripped.rstrip("=") + "=")


class AesGcmCipher:
    """AES-256-GCM with a random 96-bit nonce per message (see the module docstring).

    ``key`` must be 32 bytes (ValueError otherwise). ``decrypt`` raises ``DecryptionFailed``
    for a wrong key, wrong associated data, a changed or truncated ciphertext or an unknown
    format, and never returns unauthenticated bytes.
    """

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"an AES-256-GCM key is {KEY_BYTES} bytes, got {len(key)}")
        self._aead = AESGCM(key)

    @classmethod
    def from_urlsafe_b64(cls, text: str) -> AesGcmCipher:
        """The cipher of an ENCRYPTION_KEY value (see ``parse_key``)."""
        return cls(parse_key(text))

    @classmethod
    def generate(cls) -> AesGcmCipher:
        """A cipher with a fresh random key (the embedded default: one per process)."""
        return cls(os.urandom(KEY_BYTES))

    def __repr__(self) -> str:
        return "AesGcmCipher(<key hidden>)"

    def encrypt(self, plaintext: bytes, associated_data: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return FORMAT_V1 + nonce + self._aead.encrypt(nonce, plaintext, associated_data)

    def decrypt(self, ciphertext: bytes, associated_data: bytes) -> bytes:
        if len(ciphertext) < _HEADER + TAG_BYTES or ciphertext[:1] != FORMAT_V1:
            raise DecryptionFailed("ciphertext is truncated or of an unknown format")
        nonce = ciphertext[1:_HEADER]
        try:
            return self._aead.decrypt(nonce, ciphertext[_HEADER:], associated_data)
        except InvalidTag:
            raise DecryptionFailed(
                "ciphertext does not authenticate: wrong key, wrong owner or tampered"
            ) from None

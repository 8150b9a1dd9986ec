"""TransportKey on RSA-3072 (``cryptography``): one key pair per deployment.

The key pair is made once, by whichever process needs it first, and kept in a ``KeyStore``
under ``name`` as ``{"format": 1, "private_key": base64url(cipher.encrypt(PKCS#8 DER,
associated_data=name))}``: the private half is never stored in clear, and a process with
another ENCRYPTION_KEY cannot open it (``TransportKeyUnavailable``) instead of silently making a
second key. Concurrent first uses (several processes, several requests) converge on the one
document the store kept.

Clients seal credentials either as base64url of an RSA-OAEP-256 (SHA-256, MGF1-SHA-256)
ciphertext, which holds at most ``max_direct_bytes`` of plaintext (318 for RSA-3072), or as a
JWE compact serialization (RFC 7516) with ``alg`` RSA-OAEP-256 and ``enc`` A256GCM, which
holds any size and is what JOSE libraries produce from the served JWK.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tradecore.ports.crypto import (
    CredentialCipher,
    DecryptionFailed,
    KeyStore,
    TransportKeyUnavailable,
)

DEFAULT_KEY_NAME = "tradecore:credentials-transport-key"
KEY_SIZE = 3072
PUBLIC_EXPONENT = 65537
ALGORITHM = "RSA-OAEP-256"
CONTENT_ENCRYPTION = "A256GCM"
MAX_SEALED_CHARS = 32 * 1024
DOCUMENT_FORMAT = 1

_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_OAEP = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
_UNSEAL_FAILED = "encrypted credentials could not be decrypted with this service's key"


def b64url_encode(raw: bytes) -> str:
    """Base64url without padding (RFC 7515 section 2)."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Strict base64url, padding optional; ``DecryptionFailed`` for any other character."""
    body = text.rstrip("=")
    if _B64URL.fullmatch(body) is None or len(body) % 4 == 1 or len(text) - len(body) > 2:
        raise DecryptionFailed("not base64url")
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))


def public_jwk(key: rsa.RSAPublicKey) -> dict[str, str]:
    """``key`` as a JWK for RSA-OAEP-256 encryption; ``kid`` is its RFC 7638 thumbprint."""
    numbers = key.public_numbers()

    def member(value: int) -> str:
        return b64url_encode(value.to_bytes((value.bit_length() + 7) // 8, "big"))

    required = {"e": member(numbers.e), "kty": "RSA", "n": member(numbers.n)}
    thumbprint = hashlib.sha256(
        json.dumps(required, separators=(",", ":"), sort_keys=True).encode("ascii")
    ).digest()
    return {**required, "alg": ALGORITHM, "use": "enc", "kid": b64url_encode(thumbprint)}


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) != len(pairs):
        raise DecryptionFailed("JWE header repeats a member")
    return members


class RsaTransportKey:
    """TransportKey whose key pair lives, encrypted with ``cipher``, in ``store``.

    Loaded (or made) on first use, then held in memory. Raises ``TransportKeyUnavailable``
    when the stored key does not open with ``cipher`` (another ENCRYPTION_KEY), and whatever
    the store raises (``StoreUnavailable``) while loading; ``unseal`` raises
    ``DecryptionFailed`` for anything that is not a ciphertext for this key.
    """

    def __init__(
        self,
        store: KeyStore,
        cipher: CredentialCipher,
        *,
        name: str = DEFAULT_KEY_NAME,
        key_size: int = KEY_SIZE,
    ) -> None:
        self._store = store
        self._cipher = cipher
        self._name = name
        self._key_size = key_size
        self._private: rsa.RSAPrivateKey | None = None
        self._jwk: dict[str, str] | None = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"RsaTransportKey(name={self._name!r})"

    async def public_jwk(self) -> Mapping[str, str]:
        await self._key()
        assert self._jwk is not None
        return dict(self._jwk)

    @property
    def max_direct_bytes(self) -> int:
        """The longest plaintext a bare RSA-OAEP-256 ciphertext can carry."""
        return self._key_size // 8 - 2 * hashes.SHA256.digest_size - 2

    async def unseal(self, sealed: str) -> bytes:
        if not isinstance(sealed, str) or not sealed or len(sealed) > MAX_SEALED_CHARS:
            raise DecryptionFailed(_UNSEAL_FAILED)
        key = await self._key()
        try:
            if "." in sealed:
                return self._open_jwe(key, sealed)
            return key.decrypt(b64url_decode(sealed), _OAEP)
        except (DecryptionFailed, ValueError, InvalidTag, RecursionError):
            raise DecryptionFailed(_UNSEAL_FAILED) from None

    def _open_jwe(self, key: rsa.RSAPrivateKey, sealed: str) -> bytes:
        parts = sealed.split(".")
        if len(parts) != 5:
            raise DecryptionFailed("not a JWE compact serialization")
        protected, encrypted_key, iv, ciphertext, tag = parts
        header = json.loads(b64url_decode(protected), object_pairs_hook=_unique_members)
        if (
            not isinstance(header, dict)
            or header.get("alg") != ALGORITHM
            or header.get("enc") != CONTENT_ENCRYPTION
            or "zip" in header
            or "crit" in header
            or header.get("kid", self._kid()) != self._kid()
        ):
            raise DecryptionFailed("unsupported JWE header")
        content_key = key.decrypt(b64url_decode(encrypted_key), _OAEP)
        nonce = b64url_decode(iv)
        if len(content_key) != 32 or len(nonce) != 12:
            raise DecryptionFailed("malformed JWE")
        body = b64url_decode(ciphertext) + b64url_decode(tag)
        return AESGCM(content_key).decrypt(nonce, body, protected.encode("ascii"))

    def _kid(self) -> str:
        assert self._jwk is not None
        return self._jwk["kid"]

    async def _key(self) -> rsa.RSAPrivateKey:
        if self._private is not None:
            return self._private
        async with self._lock:
            if self._private is None:
                document = await self._store.load(self._name)
                if document is None:
                    fresh = await asyncio.to_thread(self._new_document)
                    document = await self._store.create_if_absent(self._name, fresh)
                private = self._open(document)
                self._jwk = public_jwk(private.public_key())
                self._private = private
        return self._private

    def _new_document(self) -> dict[str, Any]:
        private = rsa.generate_private_key(public_exponent=PUBLIC_EXPONENT, key_size=self._key_size)
        der = private.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        sealed = self._cipher.encrypt(der, self._name.encode("utf-8"))
        return {"format": DOCUMENT_FORMAT, "private_key": b64url_encode(sealed)}

    def _open(self, document: Mapping[str, Any]) -> rsa.RSAPrivateKey:
        sealed = document.get("private_key")
        if document.get("format") != DOCUMENT_FORMAT or not isinstance(sealed, str):
            raise TransportKeyUnavailable(f"key document {self._name!r} has an unknown format")
        try:
            der = self._cipher.decrypt(b64url_decode(sealed), self._name.encode("utf-8"))
        except DecryptionFailed:
            raise TransportKeyUnavailable(
                f"the stored transport key {self._name!r} does not open with this "
                "ENCRYPTION_KEY (every process must use the same one)"
            ) from None
        private = serialization.load_der_private_key(der, password=None)
        if not isinstance(private, rsa.RSAPrivateKey):
            raise TransportKeyUnavailable(f"key document {self._name!r} holds no RSA key")
        return private

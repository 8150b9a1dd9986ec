"""AesGcmCipher (credentials at rest) and RsaTransportKey (credentials in transit, one key pair
per deployment kept encrypted in a KeyStore)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given
from hypothesis import strategies as st

from tradecore.ports.crypto import (
    CredentialCipher,
    DecryptionFailed,
    KeyStore,
    TransportKey,
    TransportKeyUnavailable,
)
from tradecore_adapters.crypto.cipher import AesGcmCipher, parse_key
from tradecore_adapters.crypto.transport import (
    DEFAULT_KEY_NAME,
    RsaTransportKey,
    b64url_decode,
    b64url_encode,
)
from tradecore_adapters.memory.documents import MemoryDocumentStore

KEY = bytes(range(32))
OAEP = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
TEST_KEY_SIZE = 2048  # the tests check the protocol, not the key size; production uses 3072


# --- AES-GCM at rest -----------------------------------------------------------------------


def test_cipher_implements_the_port() -> None:
    assert isinstance(AesGcmCipher(KEY), CredentialCipher)


@given(plaintext=st.binary(max_size=2048), owner=st.binary(max_size=64))
def test_round_trip_with_the_same_key_and_owner(plaintext: bytes, owner: bytes) -> None:
    cipher = AesGcmCipher(KEY)
    sealed = cipher.encrypt(plaintext, owner)
    assert cipher.decrypt(sealed, owner) == plaintext
    assert AesGcmCipher(KEY).decrypt(sealed, owner) == plaintext  # a new process, same key


def test_ciphertext_is_format_nonce_body_tag_and_never_the_plaintext() -> None:
    plaintext = b'{"api_key":"AKIA-very-secret"}'
    sealed = AesGcmCipher(KEY).encrypt(plaintext, b"acct-1")
    assert sealed[:1] == b"\x01"
    assert len(sealed) == 1 + 12 + len(plaintext) + 16
    assert b"very-secret" not in sealed
    # Standard AES-256-GCM: any implementation opens it with the key, nonce and owner.
    assert AESGCM(KEY).decrypt(sealed[1:13], sealed[13:], b"acct-1") == plaintext


def test_every_message_gets_a_fresh_nonce() -> None:
    cipher = AesGcmCipher(KEY)
    sealed = [cipher.encrypt(b"same", b"acct-1") for _ in range(200)]
    assert len({s[1:13] for s in sealed}) == 200
    assert len(set(sealed)) == 200


def test_a_wrong_key_is_refused() -> None:
    sealed = AesGcmCipher(KEY).encrypt(b"secret", b"acct-1")
    with pytest.raises(DecryptionFailed, match="wrong key, wrong owner or tampered"):
        AesGcmCipher(os.urandom(32)).decrypt(sealed, b"acct-1")


def test_another_owner_cannot_open_it() -> None:
    """Credentials copied onto another account's row do not decrypt there."""
    cipher = AesGcmCipher(KEY)
    sealed = cipher.encrypt(b"secret", b"acct-1")
    with pytest.raises(DecryptionFailed):
        cipher.decrypt(sealed, b"acct-2")


@given(data=st.data())
def test_any_changed_byte_is_refused(data: st.DataObject) -> None:
    cipher = AesGcmCipher(KEY)
    sealed = bytearray(cipher.encrypt(b'{"api_key":"k"}', b"acct-1"))
    position = data.draw(st.integers(0, len(sealed) - 1))
    flip = data.draw(st.integers(1, 255))
    sealed[position] ^= flip
    with pytest.raises(DecryptionFailed):
        cipher.decrypt(bytes(sealed), b"acct-1")


@given(cut=st.integers(0, 38))
def test_truncated_or_empty_ciphertexts_are_refused(cut: int) -> None:
    cipher = AesGcmCipher(KEY)
    sealed = cipher.encrypt(b"0123456789", b"acct-1")
    assert len(sealed) == 39
    with pytest.raises(DecryptionFailed):
        cipher.decrypt(sealed[:cut], b"acct-1")


def test_keys_must_be_32_bytes() -> None:
    for size in (0, 16, 24, 31, 33):
        with pytest.raises(ValueError, match="32 bytes"):
            AesGcmCipher(b"k" * size)
    assert repr(AesGcmCipher(b"k" * 32)) == "AesGcmCipher(<key hidden>)"


def test_encryption_key_parsing() -> None:
    for _ in range(50):
        text = secrets.token_urlsafe(32)
        assert len(parse_key(text)) == 32
        assert parse_key(text + "=") == parse_key(text)
    raw = os.urandom(32)
    cipher = AesGcmCipher.from_urlsafe_b64(base64.urlsafe_b64encode(raw).decode())
    assert AesGcmCipher(raw).decrypt(cipher.encrypt(b"x", b"a"), b"a") == b"x"
    for bad in ("", "short", secrets.token_urlsafe(31), secrets.token_urlsafe(33), "+" * 43):
        with pytest.raises(ValueError, match="URL-safe base64"):
            parse_key(bad)


# --- the transport key -----------------------------------------------------------------------


class CountingStore(MemoryDocumentStore):
    """A KeyStore that yields on every call (so concurrent callers interleave) and counts
    the documents offered to it."""

    def __init__(self) -> None:
        super().__init__()
        self.offered = 0

    async def load(self, name: str) -> dict[str, Any] | None:
        await asyncio.sleep(0)
        return await super().load(name)

    async def create_if_absent(self, name: str, document: dict[str, Any]) -> dict[str, Any]:
        self.offered += 1
        await asyncio.sleep(0)
        return await super().create_if_absent(name, document)


def transport(store: KeyStore, key: bytes = KEY) -> RsaTransportKey:
    return RsaTransportKey(store, AesGcmCipher(key), key_size=TEST_KEY_SIZE)


def public_key_of(jwk: dict[str, str]) -> rsa.RSAPublicKey:
    n = int.from_bytes(b64url_decode(jwk["n"]), "big")
    e = int.from_bytes(b64url_decode(jwk["e"]), "big")
    return rsa.RSAPublicNumbers(e, n).public_key()


def jwe(jwk: dict[str, Any], plaintext: bytes, **header: Any) -> str:
    """A JWE compact serialization, as a JOSE library makes it from the served JWK."""
    fields = {"alg": "RSA-OAEP-256", "enc": "A256GCM", "kid": jwk["kid"], **header}
    protected = b64url_encode(
        json.dumps({k: v for k, v in fields.items() if v is not None}).encode()
    )
    cek, iv = os.urandom(32), os.urandom(12)
    sealed = AESGCM(cek).encrypt(iv, plaintext, protected.encode("ascii"))
    encrypted_key = public_key_of(jwk).encrypt(cek, OAEP)
    parts = (encrypted_key, iv, sealed[:-16], sealed[-16:])
    return ".".join([protected, *(b64url_encode(p) for p in parts)])


async def test_transport_key_is_a_jwk_without_private_members() -> None:
    key = transport(MemoryDocumentStore())
    assert isinstance(key, TransportKey)
    jwk = dict(await key.public_jwk())
    assert set(jwk) == {"kty", "n", "e", "alg", "use", "kid"}
    assert (jwk["kty"], jwk["alg"], jwk["use"], jwk["e"]) == ("RSA", "RSA-OAEP-256", "enc", "AQAB")
    assert len(b64url_decode(jwk["n"])) == TEST_KEY_SIZE // 8
    assert "=" not in jwk["n"] + jwk["kid"]


async def test_production_key_size_is_3072() -> None:
    key = RsaTransportKey(MemoryDocumentStore(), AesGcmCipher(KEY))
    jwk = await key.public_jwk()
    assert len(b64url_decode(jwk["n"])) == 384
    assert key.max_direct_bytes == 318


async def test_the_same_key_in_every_process_and_after_a_restart() -> None:
    store = CountingStore()
    first = await transport(store).public_jwk()
    assert await transport(store).public_jwk() == first  # another process, or a restart
    assert store.offered == 1


async def test_concurrent_first_uses_converge_on_one_key() -> None:
    store = CountingStore()
    processes = [transport(store) for _ in range(3)]
    keys = await asyncio.gather(*(p.public_jwk() for p in processes for _ in range(3)))
    assert len({k["kid"] for k in keys}) == 1
    assert store.offered <= 3  # at most one generation per process, one winner kept
    sealed = b64url_encode(public_key_of(dict(keys[0])).encrypt(b"hello", OAEP))
    for p in processes:
        assert await p.unseal(sealed) == b"hello"


async def test_the_private_key_is_stored_encrypted_under_the_key_name() -> None:
    store = MemoryDocumentStore()
    await transport(store).public_jwk()
    document = await store.load(DEFAULT_KEY_NAME)
    assert document is not None and set(document) == {"format", "private_key"}
    assert b"PRIVATE" not in json.dumps(document).encode()
    sealed = b64url_decode(document["private_key"])
    der = AesGcmCipher(KEY).decrypt(sealed, DEFAULT_KEY_NAME.encode())
    assert der.startswith(b"\x30")  # PKCS#8 DER, readable only with ENCRYPTION_KEY


async def test_a_process_with_another_encryption_key_refuses_clearly() -> None:
    store = MemoryDocumentStore()
    await transport(store).public_jwk()
    other = transport(store, key=os.urandom(32))
    with pytest.raises(TransportKeyUnavailable, match="ENCRYPTION_KEY"):
        await other.public_jwk()
    with pytest.raises(TransportKeyUnavailable):
        await other.unseal("AAAA")
    assert await store.load(DEFAULT_KEY_NAME) is not None  # nothing replaced


async def test_unseal_direct_rsa_oaep_256() -> None:
    key = transport(MemoryDocumentStore())
    jwk = dict(await key.public_jwk())
    plaintext = json.dumps({"api_key": "k", "api_secret": "s"}).encode()
    sealed = b64url_encode(public_key_of(jwk).encrypt(plaintext, OAEP))
    assert await key.unseal(sealed) == plaintext
    assert await key.unseal(sealed + "=" * (-len(sealed) % 4)) == plaintext


async def test_unseal_jwe_compact_of_any_size() -> None:
    key = transport(MemoryDocumentStore())
    jwk = dict(await key.public_jwk())
    plaintext = json.dumps({"private_key": "x" * 3000}).encode()
    assert await key.unseal(jwe(jwk, plaintext)) == plaintext
    assert await key.unseal(jwe({**jwk, "kid": None}, b"{}")) == b"{}"  # kid is optional ...
    with pytest.raises(DecryptionFailed):  # ... but when present it must be ours
        await key.unseal(jwe({**jwk, "kid": "another-key"}, b"{}"))


async def test_unseal_refuses_everything_else_with_one_error() -> None:
    key = transport(MemoryDocumentStore())
    jwk = dict(await key.public_jwk())
    good = b64url_encode(public_key_of(jwk).encrypt(b"hello", OAEP))
    token = jwe(jwk, b'{"a":"b"}')
    protected, *rest = token.split(".")
    other = rsa.generate_private_key(public_exponent=65537, key_size=TEST_KEY_SIZE)
    cases = [
        "",
        "not base64!",
        "A" * 40_000,
        good[:-4],
        good[:10] + ("A" if good[10] != "A" else "B") + good[11:],
        b64url_encode(other.public_key().encrypt(b"hello", OAEP)),
        b64url_encode(public_key_of(jwk).encrypt(b"hello", padding.PKCS1v15())),
        token[:-2] + ("AA" if token[-2:] != "AA" else "BA"),
        ".".join([b64url_encode(b'{"alg":"RSA1_5","enc":"A256GCM"}'), *rest]),
        ".".join([b64url_encode(b'{"alg":"RSA-OAEP-256","enc":"A128GCM"}'), *rest]),
        ".".join([b64url_encode(b'{"alg":"RSA-OAEP-256","alg":"RSA-OAEP-256"}'), *rest]),
        ".".join([b64url_encode(b"[" * 5000), *rest]),
        ".".join([protected, *rest, "extra"]),
        "a.b.c.d.e",
    ]
    for sealed in cases:
        with pytest.raises(DecryptionFailed) as caught:
            await key.unseal(sealed)
        assert str(caught.value) == (
            "encrypted credentials could not be decrypted with this service's key"
        )


STORE_WITH_KEY = MemoryDocumentStore()


@given(text=st.text(max_size=600))
def test_unseal_refuses_any_text_with_decryption_failed(text: str) -> None:
    async def scenario() -> None:
        key = RsaTransportKey(STORE_WITH_KEY, AesGcmCipher(KEY), key_size=TEST_KEY_SIZE)
        with pytest.raises(DecryptionFailed):
            await key.unseal(text)

    asyncio.run(scenario())

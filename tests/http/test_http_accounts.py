"""Trading accounts through HTTP: broker credentials uploaded plain or sealed with the served
public key, stored only encrypted, never shown again; validation and ownership."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import secrets
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from http_support import Env, Session, Trader, login, running

from tradecore.audit import AuditAction
from tradecore_adapters.crypto.transport import DEFAULT_KEY_NAME as KEY_NAME
from tradecore_entrypoints.settings import Settings

CREDENTIALS = {"api_key": "AKIA-http-key-31337", "api_secret": "hush-hush-secret-2718"}
OAEP = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)


@pytest.fixture
async def session(env: Env, trader: Trader) -> Session:
    return await login(env.client, trader.user.email)


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


async def served_key(env: Env) -> dict[str, str]:
    response = await env.client.get("/auth/public-key")
    assert response.status == 200
    jwk: dict[str, str] = await response.json()
    return jwk


def rsa_key(jwk: dict[str, str]) -> rsa.RSAPublicKey:
    n = int.from_bytes(unb64url(jwk["n"]), "big")
    return rsa.RSAPublicNumbers(int.from_bytes(unb64url(jwk["e"]), "big"), n).public_key()


def seal(jwk: dict[str, str], credentials: dict[str, str]) -> str:
    """What the dashboard sends: base64url of the RSA-OAEP-256 ciphertext of the JSON."""
    return b64url(rsa_key(jwk).encrypt(json.dumps(credentials).encode(), OAEP))


def seal_jwe(jwk: dict[str, str], credentials: dict[str, str]) -> str:
    """The same as a JWE compact serialization (RSA-OAEP-256, A256GCM), as JOSE libraries do."""
    header = b64url(
        json.dumps({"alg": "RSA-OAEP-256", "enc": "A256GCM", "kid": jwk["kid"]}).encode()
    )
    cek, iv = os.urandom(32), os.urandom(12)
    body = AESGCM(cek).encrypt(iv, json.dumps(credentials).encode(), header.encode())
    parts = (rsa_key(jwk).encrypt(cek, OAEP), iv, body[:-16], body[-16:])
    return ".".join([header, *(b64url(p) for p in parts)])


def stored_plaintext(env: Env, account_id: str) -> dict[str, str]:
    account = env.system.accounts._accounts[account_id]
    assert account.encrypted_credentials is not None
    cipher = env.container.shared.cipher()
    opened: dict[str, str] = json.loads(
        cipher.decrypt(account.encrypted_credentials, account_id.encode())
    )
    return opened


async def create(session: Session, **body: Any) -> dict[str, Any]:
    response = await session.request("POST", "/trading/accounts", json={"name": "Bybit", **body})
    assert response.status == 201, await response.text()
    created: dict[str, Any] = await response.json()
    return created


# --- the public key --------------------------------------------------------------------------


async def test_public_key_is_an_rsa_3072_oaep_256_jwk_and_stable(env: Env) -> None:
    jwk = await served_key(env)
    assert set(jwk) == {"kty", "n", "e", "alg", "use", "kid"}
    assert (jwk["kty"], jwk["alg"], jwk["use"]) == ("RSA", "RSA-OAEP-256", "enc")
    assert len(unb64url(jwk["n"])) == 384
    members = json.dumps(
        {"e": jwk["e"], "kty": "RSA", "n": jwk["n"]}, separators=(",", ":"), sort_keys=True
    )
    assert jwk["kid"] == b64url(hashlib.sha256(members.encode()).digest())  # RFC 7638
    assert await served_key(env) == jwk


async def test_public_key_is_shared_by_processes_with_one_store_and_key() -> None:
    """Two API processes (and a restart) with the same ENCRYPTION_KEY and key store serve
    one key; the private half is stored encrypted."""
    settings = Settings(encryption_key=secrets.token_urlsafe(32))
    async with running(settings) as first:
        key = await served_key(first)
        document = await first.container.adapters.documents().load(KEY_NAME)
    assert document is not None and "PRIVATE" not in json.dumps(document)
    async with running(settings) as second:  # its store holds what the first one stored
        await second.container.adapters.documents().create_if_absent(KEY_NAME, document)
        assert await served_key(second) == key
    async with running(Settings(encryption_key=secrets.token_urlsafe(32))) as other:
        await other.container.adapters.documents().create_if_absent(KEY_NAME, document)
        response = await other.client.get("/auth/public-key")
        assert response.status == 503  # another ENCRYPTION_KEY cannot open the stored key
        assert response.content_type == "application/problem+json"


# --- credentials at rest and never shown ------------------------------------------------------


async def test_credentials_are_stored_encrypted_and_never_shown(
    env: Env, session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    created = await create(session, credentials=CREDENTIALS)
    texts.append(json.dumps(created))
    account_id = created["account"]["id"]
    assert created["account"]["has_credentials"] is True
    assert created["account"]["credentials_verified"] is False
    account = env.system.accounts._accounts[account_id]
    assert account.encrypted_credentials is not None
    for value in CREDENTIALS.values():
        assert value.encode() not in account.encrypted_credentials
        assert value not in repr(account)
    assert stored_plaintext(env, account_id) == CREDENTIALS
    path = f"/trading/accounts/{account_id}"
    for method, url in (
        ("GET", "/trading/accounts"),
        ("GET", path),
        ("PATCH", path),
        ("POST", f"{path}/verify-credentials"),
        ("GET", path),
        ("POST", f"{path}/webhook-secret"),
        ("POST", f"{path}/webhook-token"),
        ("GET", f"{path}/positions"),
        ("DELETE", path),
    ):
        kwargs = {"json": {"name": "Renamed"}} if method == "PATCH" else {}
        response = await session.request(method, url, csrf=method != "GET", **kwargs)
        assert response.status < 300, (method, url, response.status)
        texts.append(await response.text() + json.dumps(dict(response.headers)))
    entries = env.audit()
    texts += [repr(s) + json.dumps(dict(s.entry.metadata), default=str) for s in entries]
    texts += [r.getMessage() for r in caplog.records]
    for value in CREDENTIALS.values():
        assert not any(value in text for text in texts)
    assert [s.entry.action for s in entries if s.entry.resource_id == account_id] == [
        AuditAction.ACCOUNT_CREATED,
        AuditAction.ACCOUNT_UPDATED,
        AuditAction.ACCOUNT_UPDATED,
        AuditAction.WEBHOOK_SECRET_REGENERATED,
        AuditAction.WEBHOOK_TOKEN_ROTATED,
        AuditAction.ACCOUNT_DELETED,
    ]
    assert env.system.accounts._accounts[account_id].encrypted_credentials is None


@pytest.mark.parametrize("sealer", [seal, seal_jwe])
async def test_sealed_upload_round_trip_with_the_served_key(
    env: Env, session: Session, sealer: Any
) -> None:
    jwk = await served_key(env)
    created = await create(session, encrypted_credentials=sealer(jwk, CREDENTIALS))
    account_id = created["account"]["id"]
    assert stored_plaintext(env, account_id) == CREDENTIALS
    assert env.last_audit().entry.metadata["credentials"] == "encrypted"
    verified = await session.request("POST", f"/trading/accounts/{account_id}/verify-credentials")
    assert await verified.json() == {"verified": True}
    # Replacing them later works the same way and needs verifying again.
    rotated = {"api_key": "rotated-key"}
    patched = await session.request(
        "PATCH",
        f"/trading/accounts/{account_id}",
        json={"encrypted_credentials": sealer(jwk, rotated)},
    )
    assert patched.status == 200
    assert (await patched.json())["credentials_verified"] is False
    assert stored_plaintext(env, account_id) == rotated


async def test_tampered_or_foreign_ciphertext_is_400(env: Env, session: Session) -> None:
    jwk = await served_key(env)
    good = seal(jwk, CREDENTIALS)
    flipped = good[:20] + ("A" if good[20] != "A" else "B") + good[21:]
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    foreign = b64url(stranger.encrypt(json.dumps(CREDENTIALS).encode(), OAEP))
    jwe = seal_jwe(jwk, CREDENTIALS)
    tampered_jwe = jwe[:-3] + ("A" if jwe[-3] != "A" else "B") + jwe[-2:]
    for sealed in (flipped, foreign, tampered_jwe, "not-base64!", good[:-8], ""):
        before = len(env.audit())
        response = await session.request(
            "POST", "/trading/accounts", json={"name": "X", "encrypted_credentials": sealed}
        )
        assert response.status == 400
        body = await response.json()
        assert body["code"] == "encrypted_credentials_invalid"
        assert response.content_type == "application/problem+json"
        assert len(env.audit()) == before + 1
        assert env.last_audit().entry.action is AuditAction.ACCOUNT_CREATED
        assert not env.last_audit().entry.success
    listed = await (await session.request("GET", "/trading/accounts", csrf=False)).json()
    assert [a["name"] for a in listed["items"]] == ["Main"]


async def test_credential_shape_is_checked(session: Session) -> None:
    for body in (
        {"name": "x", "credentials": "plain string"},
        {"name": "x", "credentials": {"api_key": 7}},
        {"name": "x", "credentials": {"bad key": "v"}},
        {"name": "x", "credentials": CREDENTIALS, "encrypted_credentials": "AAAA"},
        {"name": "x", "encrypted_credentials": 12},
    ):
        response = await session.request("POST", "/trading/accounts", json=body)
        assert response.status == 400, body


# --- PATCH validation and ownership -----------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"max_request_age": 4},
        {"max_request_age": 3601},
        {"max_request_age": "300"},
        {"max_request_age": 1.5},
        {"max_request_age": None},
        {"name": ""},
        {"name": 5},
        {"allowed_symbols": "BTCUSDT"},
        {"allowed_symbols": ["BTCUSDT", "UNLISTED"]},
        {"allowed_symbols": ["$$$"]},
        {"allowed_symbols": [None]},
        {"name": "Fine", "max_request_age": 99999},
    ],
)
async def test_patch_validation_is_400_and_changes_nothing(
    env: Env, trader: Trader, session: Session, body: dict[str, Any]
) -> None:
    path = f"/trading/accounts/{trader.account.account.id}"
    before = await (await session.request("GET", path, csrf=False)).json()
    response = await session.request("PATCH", path, json=body)
    assert response.status == 400
    assert response.content_type == "application/problem+json"
    assert await (await session.request("GET", path, csrf=False)).json() == before
    assert env.last_audit().entry.action is AuditAction.ACCOUNT_UPDATED
    assert not env.last_audit().entry.success


async def test_patch_bounds_are_inclusive(trader: Trader, session: Session) -> None:
    path = f"/trading/accounts/{trader.account.account.id}"
    for age in (5, 3600):
        response = await session.request("PATCH", path, json={"max_request_age": age})
        assert (await response.json())["max_request_age"] == age


async def test_other_users_account_is_404_everywhere(env: Env, trader: Trader) -> None:
    await env.trader("bob@example.com")
    bob = await login(env.client, "bob@example.com")
    path = f"/trading/accounts/{trader.account.account.id}"
    for method, url, body in (
        ("GET", path, None),
        ("PATCH", path, {"name": "Mine"}),
        ("DELETE", path, None),
        ("POST", f"{path}/webhook-secret", None),
        ("POST", f"{path}/webhook-token", None),
        ("POST", f"{path}/verify-credentials", None),
        ("GET", f"{path}/positions", None),
        ("GET", "/trading/accounts/does-not-exist", None),
    ):
        response = await bob.request(method, url, csrf=method != "GET", json=body)
        assert response.status == 404, (method, url)
        assert (await response.json())["detail"] == "Trading account not found"
    session = await login(env.client, trader.user.email)
    mine = await (await session.request("GET", path, csrf=False)).json()
    assert mine["name"] == "Main"
    assert (await trader.webhook()).status == 200  # token and secret untouched

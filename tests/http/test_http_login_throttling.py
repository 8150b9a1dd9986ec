"""Login throttling through HTTP (docs/security.md, "Login throttling"): the 429 carries
Retry-After, the refusal is audited, and the window passes on the embedded runtime's clock."""

from __future__ import annotations

from http_support import PASSWORD, Env

from tradecore.audit import AuditAction

CREDENTIALS = {"email": "ada@example.com", "password": PASSWORD}
WRONG = {"email": "ada@example.com", "password": "not the password"}


async def test_wrong_passwords_then_the_right_one_is_429_with_retry_after(env: Env) -> None:
    trader = await env.trader()
    for _ in range(30):
        assert (await env.client.post("/auth/login", json=WRONG)).status in (401, 429)
    response = await env.client.post("/auth/login", json=CREDENTIALS)
    assert response.status == 429
    retry_after = int(response.headers["Retry-After"])
    assert 0 < retry_after <= 900
    assert "Set-Cookie" not in response.headers
    entry = env.last_audit().entry
    assert entry.action is AuditAction.LOGIN_CREDENTIAL_ATTACK
    assert (entry.error_message, entry.user_id) == ("rate limited", trader.user.id)
    assert entry.metadata["attack_type"] == "credential_attack"
    await env.system.events.drain()
    alerts = [m for m in env.system.outbox.sent if "failed logins" in str(m).lower()]
    assert len(alerts) == 1  # the owner is told once, not for each refused attempt
    env.clock.advance(retry_after)
    assert (await env.client.post("/auth/login", json=CREDENTIALS)).status == 200


async def test_the_token_and_forgot_password_endpoints_answer_429_too(env: Env) -> None:
    await env.trader()
    for _ in range(10):
        await env.client.post("/auth/forgot-password", json={"email": "ada@example.com"})
    forgot = await env.client.post("/auth/forgot-password", json={"email": "ada@example.com"})
    assert forgot.status == 429 and int(forgot.headers["Retry-After"]) > 0
    form = {"grant_type": "password", "username": "ada@example.com", "password": "nope nope"}
    statuses = [(await env.client.post("/auth/token", data=form)).status for _ in range(6)]
    assert statuses[-1] == 429
    assert "Retry-After" in (await env.client.post("/auth/token", data=form)).headers

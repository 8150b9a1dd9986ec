"""Metrics of the embedded runtime through HTTP: a webhook order moves the order counters and
every stage histogram; refusals, attacks and failed logins are counted by class; requests
are labelled by route template, never by path; the public app serves no metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from metrics_support import MeteredEnv, metered, sample

from tradecore.orders import OrderStatus
from tradecore_adapters.metrics.http_metrics import order_outcome
from tradecore_entrypoints.container import build_container
from tradecore_entrypoints.settings import Settings

WEBHOOK_ROUTE = "/webhook/{token}/order"


@pytest.fixture
async def env() -> AsyncIterator[MeteredEnv]:
    async with metered() as env:
        yield env


async def test_a_webhook_order_moves_the_order_counters_and_every_stage(env: MeteredEnv) -> None:
    account = await env.account()

    response = await env.webhook(account)

    assert response.status == 200, await response.text()
    assert (await response.json())["status"] == OrderStatus.FILLED.value
    m = env.metrics
    assert (
        sample(m, "tradecore_orders_total", source="webhook", outcome="executed", code="none") == 1
    )
    assert (
        sample(m, "tradecore_orders_settled_total", source="webhook", status="filled", code="none")
        == 1
    )
    for stage in ("admission", "queue", "execution", "fill"):
        assert sample(m, "tradecore_order_stage_duration_seconds_count", stage=stage) == 1, stage
    assert (
        sample(m, "tradecore_http_requests_total", route=WEBHOOK_ROUTE, method="POST", status="200")
        == 1
    )
    assert (
        sample(
            m, "tradecore_http_request_duration_seconds_count", route=WEBHOOK_ROUTE, method="POST"
        )
        == 1
    )


async def test_a_wrong_secret_is_a_refused_order_and_an_attack(env: MeteredEnv) -> None:
    account = await env.account()

    response = await env.webhook(account, secret="not-the-secret")

    assert response.status == 401
    code = (await response.json())["code"]
    m = env.metrics
    assert sample(m, "tradecore_orders_total", source="webhook", outcome="refused", code=code) == 1
    assert sample(m, "tradecore_attacks_total", attack_class="webhook_credential_attack") == 1
    assert sample(m, "tradecore_order_stage_duration_seconds_count", stage="admission") == 0


async def test_a_wrong_password_is_a_login_failure(env: MeteredEnv) -> None:
    await env.account("grace@example.com")

    response = await env.client.post(
        "/auth/login", json={"email": "grace@example.com", "password": "wrong password here"}
    )

    assert response.status == 401
    assert sample(env.metrics, "tradecore_login_failures_total") == 1


async def test_requests_are_labelled_by_route_template_never_by_path(env: MeteredEnv) -> None:
    account = await env.account()
    await env.webhook(account)
    await env.client.get("/no/such/path/for-a-user-id-42")

    labels = {
        (s.labels["route"], s.labels["status"])
        for family in env.metrics.registry.collect()
        if family.name == "tradecore_http_requests"
        for s in family.samples
        if s.name == "tradecore_http_requests_total"
    }

    assert (WEBHOOK_ROUTE, "200") in labels
    assert ("unmatched", "404") in labels
    assert not any(account.webhook_token in route for route, _ in labels)


async def test_the_public_app_serves_no_metrics(env: MeteredEnv) -> None:
    response = await env.client.get("/metrics")

    assert response.status == 404


def test_without_instrument_nothing_is_wrapped_or_counted() -> None:
    container = build_container(Settings())

    assert container.core.metrics() is None
    assert type(container.services.system().orders).__name__ == "MemoryOrderHistory"


def test_each_process_has_its_own_registry() -> None:
    from tradecore_entrypoints.observability import instrument

    first, second = (instrument(build_container(Settings())) for _ in range(2))
    first.login_failures.inc()

    assert sample(first, "tradecore_login_failures_total") == 1
    assert sample(second, "tradecore_login_failures_total") == 0


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            200,
            {"status": "rejected", "error": {"code": "insufficient_margin"}},
            ("executed", "insufficient_margin"),
        ),
        (200, {"status": "filled", "error": None}, ("executed", "none")),
        (200, {"status": "rejected", "error": {"code": "from a new venue"}}, ("executed", "other")),
        (202, {"status": "queued"}, ("queued", "none")),
        (429, {"code": "rate_limited"}, ("refused", "rate_limited")),
        (405, {"type": "about:blank"}, ("refused", "http_405")),
        (503, {"code": "unavailable"}, ("failed", "unavailable")),
        (400, {"code": "Not A Code!"}, ("refused", "other")),
    ],
)
def test_an_order_answer_gives_a_bounded_outcome_and_code(
    status: int, body: dict[str, object], expected: tuple[str, str]
) -> None:
    response = web.json_response(body, status=status)

    assert order_outcome(status, response) == expected

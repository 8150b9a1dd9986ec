"""The composition root: both adapter sets fill exactly the declared names with adapters of
the declared ports, and the container picks the set from the settings."""

from __future__ import annotations

import pytest
from dependency_injector import providers

from tradecore_entrypoints.adapter_sets import (
    AdapterSet,
    MemoryAdapters,
    PostgresRedisAdapters,
)
from tradecore_entrypoints.container import build_container
from tradecore_entrypoints.settings import ConfigError, Settings
from tradecore_entrypoints.system import System

DATABASE_URL = "postgresql://tradecore@127.0.0.1:5432/tradecore"
REDIS_URL = "redis://127.0.0.1:6379/0"

SETS = [MemoryAdapters, PostgresRedisAdapters]


def _declared() -> dict[str, providers.Dependency[object]]:
    return {
        name: provider
        for name, provider in AdapterSet.cls_providers.items()
        if isinstance(provider, providers.Dependency)
    }


@pytest.mark.parametrize("adapter_set", SETS, ids=lambda s: s.__name__)
def test_a_set_declares_exactly_the_adapter_set_names(adapter_set: type[AdapterSet]) -> None:
    assert set(adapter_set.providers) == set(AdapterSet.providers)
    unfilled = [
        name
        for name in _declared()
        if isinstance(adapter_set.providers[name], providers.Dependency)
    ]
    assert unfilled == []


@pytest.mark.parametrize("adapter_set", SETS, ids=lambda s: s.__name__)
def test_no_provider_fills_two_names(adapter_set: type[AdapterSet]) -> None:
    """Overriding a set maps providers by name: one provider under two names would be
    overridden twice and serve the second name's adapter for both."""
    names_by_provider: dict[int, list[str]] = {}
    for name, provider in adapter_set.providers.items():
        names_by_provider.setdefault(id(provider), []).append(name)
    assert [names for names in names_by_provider.values() if len(names) > 1] == []


def test_the_workers_paper_broker_has_the_configured_conditions() -> None:
    settings = Settings(database_url=DATABASE_URL, redis_url=REDIS_URL, paper_latency_ms=250)
    container = build_container(settings)
    assert container.adapters.paper_brokers()._conditions.latency_s == 0.25
    assert container.adapters.api_paper_brokers()._conditions is None


@pytest.mark.parametrize(
    "settings",
    [Settings(), Settings(database_url=DATABASE_URL, redis_url=REDIS_URL)],
    ids=["memory", "postgres-redis"],
)
def test_every_adapter_is_of_its_declared_port(settings: Settings) -> None:
    """Building the set connects to nothing (connections open on ``System.start``)."""
    container = build_container(settings)
    for name, declared in _declared().items():
        adapter = getattr(container.adapters, name)()
        assert isinstance(adapter, declared.instance_of), name


def test_the_set_follows_the_settings() -> None:
    memory = build_container(Settings()).services.system()
    real = build_container(Settings(database_url=DATABASE_URL, redis_url=REDIS_URL))
    system: System = real.services.system()
    assert memory.in_process_workers and not system.in_process_workers
    assert type(memory.orders).__name__ == "MemoryOrderHistory"
    assert type(system.orders).__name__ == "PostgresOrderHistory"
    listeners = [system.accounts, system.queue, system.directory, system.fill_tasks]
    assert system.stores.listeners == listeners  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "settings",
    [Settings(database_url=DATABASE_URL), Settings(redis_url=REDIS_URL)],
    ids=["database only", "redis only"],
)
def test_one_store_without_the_other_is_refused(settings: Settings) -> None:
    with pytest.raises(ConfigError, match="DATABASE_URL and REDIS_URL go together"):
        build_container(settings)


def test_one_container_builds_each_part_once() -> None:
    container = build_container(Settings())
    system: System = container.services.system()
    http = container.services.http()
    assert http.webhooks is system.webhooks
    assert http.orders is system.orders
    assert container.services.verifier() is system.verifier
    assert container.shared.mailer() is system.outbox  # no SMTP_URL: the logging outbox


def test_the_identity_parts_share_one_bot_challenge_and_one_token_signer() -> None:
    services = build_container(Settings()).services
    login, lifetime = services.password_login(), services.session_lifetime()
    assert login._challenge is services.registration()._challenge is services.bot_challenge()
    assert login._tokens is lifetime._tokens is services.authentication()._tokens
    assert services.http().session_lifetime is lifetime  # what `admin revoke-sessions` uses


def test_the_embedded_paper_broker_has_the_configured_conditions() -> None:
    container = build_container(Settings(paper_latency_ms=250))
    assert container.adapters.paper_brokers()._conditions.latency_s == 0.25

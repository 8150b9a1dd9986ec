"""The composition root: one container builds every part of every tradecore process.

``Application`` is four containers wired together:

* ``Core``: the settings (``tradecore_entrypoints.settings``), the runtime ports every part
  shares (clock, sleeper, randomness) and the service settings derived from the settings;
* ``adapters``: one adapter set (``adapter_sets.MemoryAdapters`` without DATABASE_URL and
  REDIS_URL, ``adapter_sets.PostgresRedisAdapters`` with both), chosen by
  ``adapter_set_for`` and nowhere else;
* ``shared``: the adapters both sets use (``adapter_sets.SharedAdapters``);
* ``services``: every use case, the ``System`` a process runs and the HTTP bundle
  (``use_cases.UseCases``).

Entry points ask the container for what they run (``container.services.system()``,
``make_app(container)``); tests replace a runtime port before the first use
(``container.core.clock.override(providers.Object(clock))``) or call ``build_embedded``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from aiohttp import web
from dependency_injector import containers, providers

from tradecore.ports.identity import PasswordHasher
from tradecore.ports.runtime import Clock, RandomSource, Sleeper
from tradecore.services.execution.worker_host import HostSettings
from tradecore.services.orders.settings import OrderSettings
from tradecore_adapters.http import create_app
from tradecore_adapters.metrics import ProcessMetrics, metrics_middleware
from tradecore_adapters.system import AsyncioSleeper, SecretsRandom, SystemClock
from tradecore_entrypoints.adapter_sets import (
    AdapterSet,
    MemoryAdapters,
    PostgresRedisAdapters,
    SharedAdapters,
)
from tradecore_entrypoints.settings import ConfigError, Settings
from tradecore_entrypoints.system import System
from tradecore_entrypoints.use_cases import UseCases

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "http://127.0.0.1:8080"


class Core(containers.DeclarativeContainer):
    """Settings, the runtime ports, and the settings each part takes."""

    settings = providers.Dependency(instance_of=Settings)
    base_url = providers.Object(DEFAULT_BASE_URL)
    clock = providers.Singleton(SystemClock)
    sleeper = providers.Singleton(AsyncioSleeper)
    random = providers.Singleton(SecretsRandom)
    order_settings = providers.Singleton(Settings.order_settings, settings)
    host_settings = providers.Singleton(Settings.host_settings, settings)
    auth_settings = providers.Singleton(Settings.auth_settings, settings)
    reset_settings = providers.Singleton(Settings.reset_settings, settings, base_url)
    http_config = providers.Singleton(Settings.http_config, settings, base_url)
    paper_conditions = providers.Singleton(Settings.paper_conditions, settings)
    # this process's metrics: None (off) unless ``observability.instrument`` put them in
    metrics: providers.Provider[ProcessMetrics | None] = providers.Object(None)


class Application(containers.DeclarativeContainer):
    """Everything, wired; ``adapters`` is the memory set until ``build_container`` says
    otherwise."""

    settings = providers.Dependency(instance_of=Settings)
    core = providers.Container(Core, settings=settings)
    adapters = providers.Container(MemoryAdapters, core=core)
    shared = providers.Container(SharedAdapters, core=core, adapters=adapters)
    services = providers.Container(UseCases, core=core, adapters=adapters, shared=shared)


def adapter_set_for(settings: Settings) -> type[AdapterSet]:
    """The adapter set for the configured runtime: memory without DATABASE_URL and
    REDIS_URL, Postgres and Redis with both (one without the other is refused)."""
    if settings.runtime == "embedded":
        return MemoryAdapters
    if settings.database_url is None or settings.redis_url is None:
        raise ConfigError("DATABASE_URL and REDIS_URL go together: set both or neither")
    return PostgresRedisAdapters


def build_container(settings: Settings, *, base_url: str | None = None) -> Application:
    """The container for ``settings`` (raises ConfigError for a runtime this build cannot
    run). Override providers before the first use."""
    adapters = adapter_set_for(settings)
    container = Application(settings=settings)
    if adapters is not MemoryAdapters:
        container.adapters.override(providers.Container(adapters, core=container.core))
    container.core.base_url.override(providers.Object(base_url or settings.base_url()))
    if settings.smtp_url is None and settings.production:
        log.warning("SMTP_URL is not set: security alerts and reset mails are only logged")
    return container


def build_embedded(
    *,
    clock: Clock | None = None,
    sleeper: Sleeper | None = None,
    random: RandomSource | None = None,
    settings: OrderSettings | None = None,
    host_settings: HostSettings | None = None,
    hasher: PasswordHasher | None = None,
) -> System:
    """The embedded runtime's ``System`` (not yet started) from the default settings, with
    any of the given parts in place of the container's: what the demo, the documentation's
    example and the flow tests run."""
    container = build_container(Settings())
    replacements = [
        (container.core.clock, clock),
        (container.core.sleeper, sleeper),
        (container.core.random, random),
        (container.core.order_settings, settings),
        (container.core.host_settings, host_settings),
        (container.shared.hasher, hasher),
    ]
    for provider, value in replacements:
        if value is not None:
            provider.override(providers.Object(value))
    system: System = container.services.system()
    return system


def make_app(container: Application) -> web.Application:
    """The aiohttp application; its cleanup contexts start and stop the process's ``System``
    (with the workers where the runtime runs them in process) and close the outgoing HTTP
    session."""
    system: System = container.services.system()
    session = container.shared.client_session()

    async def runtime(_: web.Application) -> AsyncIterator[None]:
        async with system.running():
            yield

    async def client_session(_: web.Application) -> AsyncIterator[None]:
        yield
        await session.close()

    metrics = container.core.metrics()
    return create_app(
        container.services.http(),
        container.core.http_config(),
        cleanup=[client_session, runtime],
        outer_middlewares=() if metrics is None else (metrics_middleware(metrics),),
    )

"""The order and security use cases over whichever adapter set a runtime chose: the one place
both the embedded and the production runtime wire them."""

from __future__ import annotations

import attrs

from tradecore.broker import InstrumentDirectory
from tradecore.ports.identity import Mailer, PasswordHasher
from tradecore.ports.messaging import OrderQueue, WorkerDirectory
from tradecore.ports.protection import (
    AlertThrottle,
    RateLimiter,
    ReplayStore,
    WebhookAdmission,
)
from tradecore.ports.repositories import (
    AllowedIpRepository,
    AuditLog,
    OrderHistory,
    TradingAccountRepository,
    UserRepository,
)
from tradecore.ports.runtime import Clock, RandomSource
from tradecore.services.dashboard_order import DashboardOrders
from tradecore.services.dispatch import OrderDispatcher
from tradecore.services.order_checks import OrderChecks
from tradecore.services.provisioning import Provisioning
from tradecore.services.security_events import SecurityEvents
from tradecore.services.settings import OrderSettings
from tradecore.services.webhook_intake import WebhookIntake


@attrs.frozen
class OrderFlows:
    """The use cases the API side of a runtime exposes."""

    events: SecurityEvents
    provisioning: Provisioning
    webhooks: WebhookIntake
    dashboard: DashboardOrders


def order_flows(
    *,
    users: UserRepository,
    accounts: TradingAccountRepository,
    orders: OrderHistory,
    audit: AuditLog,
    allowed_ips: AllowedIpRepository,
    replay: ReplayStore,
    limiter: RateLimiter,
    admission: WebhookAdmission,
    throttle: AlertThrottle,
    mailer: Mailer,
    queue: OrderQueue,
    directory: WorkerDirectory,
    instruments: InstrumentDirectory,
    hasher: PasswordHasher,
    clock: Clock,
    random: RandomSource,
    settings: OrderSettings,
) -> OrderFlows:
    events = SecurityEvents(audit, users, throttle, mailer, clock)
    checks = OrderChecks(limiter, orders, instruments, settings)
    dispatcher = OrderDispatcher(orders, queue, directory, random, settings)
    return OrderFlows(
        events=events,
        provisioning=Provisioning(users, accounts, hasher, clock, random),
        webhooks=WebhookIntake(
            accounts, admission, replay, checks, dispatcher, events, clock, settings
        ),
        dashboard=DashboardOrders(
            accounts, allowed_ips, checks, dispatcher, events, clock, settings
        ),
    )

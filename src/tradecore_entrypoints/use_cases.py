"""The services container: every use case of the core, built over whichever adapter set the
runtime chose, and the running ``System`` and HTTP bundle made of them.

A new service is one provider here (and a field of the HTTP bundle if a route calls it);
it takes ports from ``adapters`` / ``shared`` and settings from ``core``, never an adapter
class.
"""

from __future__ import annotations

from importlib import metadata

from dependency_injector import containers, providers

from tradecore.services.accounts.account_credentials import AccountCredentials
from tradecore.services.accounts.provisioning import Provisioning
from tradecore.services.accounts.trading_accounts import TradingAccounts
from tradecore.services.audit.events import SecurityEvents
from tradecore.services.credentials.broker_accounts import StoredBrokerAccounts
from tradecore.services.credentials.credential_vault import CredentialVault
from tradecore.services.execution.deployment_status import DeploymentStatus
from tradecore.services.execution.fill_verifier import FillVerifier
from tradecore.services.execution.queued_recovery import QueuedRecovery
from tradecore.services.execution.worker import UserWorker
from tradecore.services.execution.worker_host import WorkerHost
from tradecore.services.identity.allowed_ips import AllowedIps
from tradecore.services.identity.api_keys import ApiKeys
from tradecore.services.identity.audit import IdentityAudit
from tradecore.services.identity.bot_challenge import BotChallenge
from tradecore.services.identity.first_run_setup import FirstRunSetup
from tradecore.services.identity.login import PasswordLogin
from tradecore.services.identity.password_reset import PasswordReset
from tradecore.services.identity.registration import Registration
from tradecore.services.identity.request_authentication import RequestAuthenticator
from tradecore.services.identity.session_lifetime import SessionLifetime
from tradecore.services.identity.session_tokens import SessionTokens
from tradecore.services.orders.daily_orders import DailyOrders
from tradecore.services.orders.dashboard_order import DashboardOrders
from tradecore.services.orders.dispatch import OrderDispatcher
from tradecore.services.orders.history_reads import HistoryReads
from tradecore.services.orders.order_checks import OrderChecks
from tradecore.services.orders.webhook_intake import WebhookIntake
from tradecore_adapters.brokers.account import VenueAccountBroker
from tradecore_adapters.http import Services as HttpServices
from tradecore_entrypoints.settings import Settings
from tradecore_entrypoints.system import System


def installed_version() -> str:
    """The installed tradecore distribution's version (``unknown`` when run from a source
    tree that was never installed)."""
    try:
        return metadata.version("tradecore")
    except metadata.PackageNotFoundError:
        return "unknown"


class UseCases(containers.DeclarativeContainer):
    """The core's services. ``core``: settings, clock, randomness; ``adapters``: an
    ``AdapterSet``; ``shared``: ``SharedAdapters``."""

    core = providers.DependenciesContainer()
    adapters = providers.DependenciesContainer()
    shared = providers.DependenciesContainer()

    # --- security events and the audit log -----------------------------------------------
    events = providers.Singleton(
        SecurityEvents,
        adapters.audit,
        adapters.users,
        adapters.throttle,
        shared.mailer,
        core.clock,
    )

    # --- identity: who the caller is, and the user's own security settings --------------
    identity_audit = providers.Singleton(IdentityAudit, events)
    bot_challenge = providers.Singleton(
        BotChallenge,
        shared.captcha,
        enabled=core.auth_settings.provided.captcha_enabled,
        bypass_user_agents=core.auth_settings.provided.captcha_bypass_user_agents,
    )
    session_tokens = providers.Singleton(
        SessionTokens, shared.codec, core.random, core.auth_settings
    )
    password_login = providers.Singleton(
        PasswordLogin,
        adapters.users,
        adapters.sessions,
        shared.hasher,
        bot_challenge,
        session_tokens,
        identity_audit,
        core.clock,
        core.random,
        core.auth_settings,
        limiter=adapters.limiter,
    )
    session_lifetime = providers.Singleton(
        SessionLifetime,
        adapters.users,
        adapters.sessions,
        session_tokens,
        identity_audit,
        core.clock,
    )
    authentication = providers.Singleton(
        RequestAuthenticator,
        adapters.users,
        adapters.sessions,
        adapters.api_keys,
        session_tokens,
        core.clock,
    )
    registration = providers.Singleton(
        Registration,
        adapters.users,
        shared.hasher,
        bot_challenge,
        identity_audit,
        core.clock,
        core.random,
        terms_version=core.settings.provided.terms_version,
        mailer=shared.mailer,
        throttle=adapters.throttle,
        link_base=core.reset_settings.provided.link_base,
        limiter=adapters.limiter,
        settings=core.auth_settings,
    )
    password_reset = providers.Singleton(
        PasswordReset,
        adapters.users,
        adapters.sessions,
        adapters.resets,
        shared.hasher,
        shared.mailer,
        identity_audit,
        core.clock,
        core.random,
        core.reset_settings,
        throttle=adapters.throttle,
        limiter=adapters.limiter,
        auth=core.auth_settings,
    )
    api_keys = providers.Singleton(
        ApiKeys, adapters.api_keys, identity_audit, core.clock, core.random
    )
    allowed_ips = providers.Singleton(
        AllowedIps, adapters.allowed_ips, identity_audit, core.clock, core.random
    )

    # --- the operator: first-run setup and the deployment status -------------------------
    setup = providers.Singleton(
        FirstRunSetup,
        adapters.users,
        shared.hasher,
        identity_audit,
        core.clock,
        core.random,
        terms_version=core.settings.provided.terms_version,
    )
    deployment = providers.Singleton(
        DeploymentStatus,
        adapters.schema,
        adapters.directory,
        adapters.queue,
        adapters.fill_tasks,
        core.clock,
        version=providers.Callable(installed_version),
    )

    # --- trading accounts: the account, its webhook secret and token, its credentials -----
    provisioning = providers.Singleton(
        Provisioning, adapters.users, adapters.accounts, shared.hasher, core.clock, core.random
    )
    credential_vault = providers.Singleton(CredentialVault, shared.cipher, shared.transport_key)
    broker_accounts = providers.Singleton(StoredBrokerAccounts, adapters.accounts, credential_vault)
    account_broker = providers.Singleton(
        VenueAccountBroker,
        shared.api_brokers,
        broker_accounts,
        timeout_s=providers.Callable(Settings.venue_check_timeout_s, core.settings),
    )
    trading_accounts = providers.Singleton(
        TradingAccounts,
        adapters.accounts,
        provisioning,
        credential_vault,
        shared.instruments,
        events,
    )
    account_credentials = providers.Singleton(
        AccountCredentials,
        adapters.accounts,
        provisioning,
        credential_vault,
        account_broker,
        events,
    )

    # --- orders: intake, checks, hand-over to the user's worker --------------------------
    daily_orders = providers.Singleton(DailyOrders, adapters.daily, adapters.orders)
    checks = providers.Singleton(
        OrderChecks, adapters.limiter, daily_orders, shared.instruments, core.order_settings
    )
    dispatcher = providers.Singleton(
        OrderDispatcher,
        adapters.orders,
        adapters.queue,
        adapters.directory,
        core.random,
        core.order_settings,
    )
    webhooks = providers.Singleton(
        WebhookIntake,
        adapters.accounts,
        adapters.admission,
        adapters.replay,
        daily_orders,
        checks,
        dispatcher,
        events,
        core.clock,
        core.order_settings,
    )
    dashboard = providers.Singleton(
        DashboardOrders,
        adapters.accounts,
        adapters.allowed_ips,
        checks,
        dispatcher,
        events,
        core.clock,
        core.order_settings,
    )

    # --- execution: per-user workers under leases, fill verification ---------------------
    worker = providers.Factory(
        UserWorker,
        orders=adapters.orders,
        brokers=shared.brokers,
        fill_tasks=adapters.fill_tasks,
        clock=core.clock,
        sleeper=core.sleeper,
        accounts=broker_accounts,
        audit=adapters.audit,
    )
    queued_recovery = providers.Singleton(
        QueuedRecovery,
        adapters.orders,
        adapters.accounts,
        adapters.queue,
        core.clock,
        grace_s=core.host_settings.provided.recovery_grace_s,
        max_queue_age_s=core.order_settings.provided.max_queue_age_s,
    )
    host = providers.Singleton(
        WorkerHost,
        adapters.directory,
        adapters.queue,
        worker.provider,
        core.clock,
        core.sleeper,
        core.host_settings,
        holder=adapters.worker_holder,
        recovery=queued_recovery,
    )
    verifier = providers.Singleton(
        FillVerifier,
        adapters.fill_tasks,
        adapters.orders,
        host.provided.check_order_status,
        core.clock,
    )

    # --- the process --------------------------------------------------------------------
    system = providers.Singleton(
        System,
        clock=core.clock,
        sleeper=core.sleeper,
        random=core.random,
        settings=core.order_settings,
        stores=adapters.stores,
        users=adapters.users,
        sessions=adapters.sessions,
        api_keys=adapters.api_keys,
        allowed_ips=adapters.allowed_ips,
        accounts=adapters.accounts,
        orders=adapters.orders,
        audit=adapters.audit,
        replay=adapters.replay,
        limiter=adapters.limiter,
        admission=adapters.admission,
        throttle=adapters.throttle,
        outbox=shared.outbox,
        mailer=shared.mailer,
        queue=adapters.queue,
        directory=adapters.directory,
        fill_tasks=adapters.fill_tasks,
        exchange=adapters.exchange,
        simulation_exchange=adapters.simulation_exchange,
        events=events,
        provisioning=provisioning,
        webhooks=webhooks,
        dashboard=dashboard,
        host=host,
        verifier=verifier,
        in_process_workers=adapters.in_process_workers,
        fill_polling=adapters.fill_polling,
        drains=providers.List(password_reset.provided.drain),
    )
    http = providers.Singleton(
        HttpServices,
        password_login=password_login,
        session_lifetime=session_lifetime,
        authentication=authentication,
        registration=registration,
        password_reset=password_reset,
        api_keys=api_keys,
        allowed_ips=allowed_ips,
        webhooks=webhooks,
        dashboard=dashboard,
        provisioning=provisioning,
        events=events,
        accounts=adapters.accounts,
        orders=adapters.orders,
        audit=adapters.audit,
        instruments=shared.instruments,
        brokers=account_broker,
        readiness=adapters.stores,
        clock=core.clock,
        trading_accounts=trading_accounts,
        account_credentials=account_credentials,
        transport_key=shared.transport_key,
        history_reads=providers.Singleton(HistoryReads, adapters.limiter),
        setup=setup,
        deployment=deployment,
    )

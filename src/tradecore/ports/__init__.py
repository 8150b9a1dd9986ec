"""Ports: every effect the core needs, as Protocols whose docstrings state the contract.

Adapters in ``tradecore_adapters`` implement them (memory for the embedded default and tests;
Redis, Postgres, aiohttp and others for production).
"""

from tradecore.broker import Broker, BrokerFactory
from tradecore.ports.identity import CaptchaVerifier, Mailer, PasswordHasher, TokenCodec
from tradecore.ports.messaging import (
    FillDelivery,
    FillTask,
    FillTaskQueue,
    OrderQueue,
    WorkerDirectory,
)
from tradecore.ports.protection import AlertThrottle, RateDecision, RateLimiter, ReplayStore
from tradecore.ports.repositories import (
    AllowedIpRepository,
    ApiKeyRepository,
    AuditLog,
    OrderHistory,
    SessionRepository,
    TradingAccountRepository,
    UserRepository,
)
from tradecore.ports.runtime import Clock, RandomSource, Sleeper

__all__ = [
    "AlertThrottle",
    "AllowedIpRepository",
    "ApiKeyRepository",
    "AuditLog",
    "Broker",
    "BrokerFactory",
    "CaptchaVerifier",
    "Clock",
    "FillDelivery",
    "FillTask",
    "FillTaskQueue",
    "Mailer",
    "OrderHistory",
    "OrderQueue",
    "PasswordHasher",
    "RandomSource",
    "RateDecision",
    "RateLimiter",
    "ReplayStore",
    "SessionRepository",
    "Sleeper",
    "TokenCodec",
    "TradingAccountRepository",
    "UserRepository",
    "WorkerDirectory",
]

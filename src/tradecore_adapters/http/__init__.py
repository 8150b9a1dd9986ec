"""The HTTP service on aiohttp: routes, middleware, problem responses, OpenAPI and docs."""

from tradecore_adapters.http.app import create_app, runner_options
from tradecore_adapters.http.config import HttpConfig
from tradecore_adapters.http.state import AccountBroker, Readiness, Services

__all__ = ["AccountBroker", "HttpConfig", "Readiness", "Services", "create_app", "runner_options"]

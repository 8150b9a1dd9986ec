"""The core stays pure: importing every core module loads no I/O or framework library."""

from __future__ import annotations

import json
import subprocess
import sys

FORBIDDEN = {
    "aiohttp",
    "redis",
    "orjson",
    "psycopg",
    "psycopg_pool",
    "jwt",
    "argon2",
    "dependency_injector",
    "structlog",
    "prometheus_client",
}

PROBE = """
import importlib, json, pkgutil, sys
import tradecore
for module in pkgutil.walk_packages(tradecore.__path__, "tradecore."):
    if module.name.startswith("tradecore.testing"):
        continue
    importlib.import_module(module.name)
print(json.dumps(sorted(sys.modules)))
"""


def test_importing_every_core_module_loads_no_io_or_framework_library() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = {name.split(".")[0] for name in json.loads(completed.stdout)}
    assert "tradecore.services.orders.webhook_intake" in json.loads(completed.stdout)
    assert loaded & FORBIDDEN == set()

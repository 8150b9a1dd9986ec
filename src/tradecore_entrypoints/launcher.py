"""The ``tradecore`` console script: checks that the server extra is installed, then runs the
command line (cli.py).

The core (``pip install tradecore``) and its test helpers (``tradecore[testing]``) install
without the web server, the store drivers and the broker libraries. Run in such an
environment, the command line would die on its first import with a traceback; the launcher
instead names what is missing and how to install it, on one line, and exits with status 2.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterable

SERVER_MODULES: tuple[str, ...] = (
    "aiohttp",
    "aiohttp_jinja2",
    "redis",
    "orjson",
    "psycopg",
    "psycopg_pool",
    "jwt",
    "argon2",
    "cryptography",
    "dependency_injector",
    "click",
    "aiosmtplib",
    "ccxt",
    "alpaca",
    "structlog",
    "prometheus_client",
)
"""The top-level modules of the ``server`` extra's distributions (uvloop and tzdata are
optional at run time); tests/packaging/test_launcher.py keeps this list and pyproject.toml in
step."""

INSTALL_HINT = "pip install 'tradecore[server]'"


def missing_modules(
    modules: Iterable[str] = SERVER_MODULES,
    find: Callable[[str], object | None] = importlib.util.find_spec,
) -> list[str]:
    """The ``modules`` that cannot be imported here (``find`` returns None for them)."""
    return [name for name in modules if find(name) is None]


def missing_extra_message(missing: Iterable[str]) -> str:
    """The one line printed when server modules are missing."""
    return (
        "tradecore: the server extra is not installed (missing: "
        f"{', '.join(missing)}); install it with {INSTALL_HINT}"
    )


def main() -> None:
    """Run the command line, or exit 2 with one line when the server extra is missing."""
    missing = missing_modules()
    if missing:
        print(missing_extra_message(missing), file=sys.stderr)
        sys.exit(2)
    try:
        from tradecore_entrypoints.cli import main as cli_main
    except ModuleNotFoundError as e:  # a dependency of a dependency, say
        print(missing_extra_message([e.name or str(e)]), file=sys.stderr)
        sys.exit(2)
    cli_main()

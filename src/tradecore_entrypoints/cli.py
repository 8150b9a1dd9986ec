"""The ``tradecore`` command line (contract.md lists the commands)."""

from __future__ import annotations

import asyncio
import logging

import click


@click.group()
@click.option("--log-level", default="WARNING", show_default=True, help="Python log level.")
def main(log_level: str) -> None:
    """tradecore: trading automation with per-user workers."""
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")


@main.command()
def demo() -> None:
    """Walk through the embedded system: reversals, a replay, a stale alert, a fill."""
    from tradecore_entrypoints.demo import run_demo

    asyncio.run(run_demo(click.echo))

"""What an operator reads about the deployment's own stores: the schema migrations."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

import attrs


@attrs.frozen
class AppliedMigration:
    """One schema migration recorded as applied, and when."""

    name: str
    applied_at: datetime


@attrs.frozen
class SchemaState:
    """The durable store's schema. ``store`` names the technology (``memory`` keeps no schema:
    both lists are empty); ``applied`` is oldest first; ``pending`` names the migrations this
    build ships that the store has not applied (``tradecore migrate`` applies them)."""

    store: str
    applied: tuple[AppliedMigration, ...]
    pending: tuple[str, ...]


@runtime_checkable
class SchemaLedger(Protocol):
    """The migration ledger of the durable store."""

    async def state(self) -> SchemaState:
        """The schema as it is now. Raises ``DatabaseUnavailable`` when the store does not
        answer."""
        ...

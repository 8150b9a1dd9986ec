"""The schema ledger of the in-memory stores: they have no schema to migrate."""

from __future__ import annotations

from tradecore.ports.deployment import SchemaState

MEMORY_SCHEMA = SchemaState(store="memory", applied=(), pending=())


class MemorySchemaLedger:
    """``SchemaLedger`` for the embedded runtime: nothing applied, nothing pending."""

    async def state(self) -> SchemaState:
        return MEMORY_SCHEMA

"""Named JSON documents: state read and written as one piece (the paper broker's books)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class DocumentStore(Protocol):
    async def load(self, name: str) -> dict[str, Any] | None:
        """The document last saved under ``name``, or None."""
        ...

    async def save(self, name: str, document: dict[str, Any]) -> None:
        """Store ``document`` under ``name``, replacing any earlier one, durably."""
        ...

    async def save_many(self, documents: Mapping[str, dict[str, Any]]) -> None:
        """Store each document under its name, replacing earlier ones, durably and
        atomically: after a failure either all of them or none of them are stored."""
        ...

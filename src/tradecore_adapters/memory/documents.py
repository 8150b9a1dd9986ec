"""Named JSON documents in a dictionary (copies in and out, like a database)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


class MemoryDocumentStore:
    def __init__(self) -> None:
        self._documents: dict[str, dict[str, Any]] = {}

    async def load(self, name: str) -> dict[str, Any] | None:
        document = self._documents.get(name)
        return None if document is None else copy.deepcopy(document)

    async def save(self, name: str, document: dict[str, Any]) -> None:
        self._documents[name] = copy.deepcopy(document)

    async def save_many(self, documents: Mapping[str, dict[str, Any]]) -> None:
        copies = {name: copy.deepcopy(document) for name, document in documents.items()}
        self._documents.update(copies)

    async def create_if_absent(self, name: str, document: dict[str, Any]) -> dict[str, Any]:
        """KeyStore: store ``document`` unless ``name`` is taken; the stored document."""
        stored = self._documents.setdefault(name, copy.deepcopy(document))
        return copy.deepcopy(stored)

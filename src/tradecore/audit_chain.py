"""The tamper-evident audit chain.

Every audit entry is sealed in order: ``seal = SHA-256(previous seal || canonical entry)``,
where the canonical entry is a JSON document of every stored field (sorted keys, no
whitespace, time in UTC, values JSON cannot hold as text, exactly as the stores keep them).
Changing any field of a sealed entry changes its seal; removing or reordering entries breaks
the link of the next one. ``first_break`` walks a chain and names the first entry that no
longer matches.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Iterable
from datetime import UTC
from typing import Any

import attrs

from tradecore.audit import AuditEntry

GENESIS = "0" * 64


_JSON_SCALARS = (str, int, float, bool, type(None))


def normalized(entry: AuditEntry) -> AuditEntry:
    """The entry as a store keeps it: metadata through JSON (values JSON cannot hold become
    text), the time in UTC. Stores seal and return this form, so seals verify on read-back.
    An entry already in that form (text keys, scalar values, a UTC time) is returned as is."""
    created_at = entry.created_at
    if created_at.tzinfo is UTC and all(
        type(key) is str and type(value) in _JSON_SCALARS for key, value in entry.metadata.items()
    ):
        return entry
    metadata = json.loads(json.dumps(dict(entry.metadata), default=str))
    return attrs.evolve(entry, metadata=metadata, created_at=created_at.astimezone(UTC))


def canonical(entry: AuditEntry) -> bytes:
    """The bytes an entry's seal covers. The entry's position is covered by the link to the
    previous seal, so the store's id is not part of it."""
    document: dict[str, Any] = {
        "user_id": entry.user_id,
        "action": entry.action.value,
        "success": entry.success,
        "ip_address": entry.context.ip_address,
        "user_agent": entry.context.user_agent,
        "request_path": entry.context.request_path,
        "request_method": entry.context.request_method,
        "error_message": entry.error_message,
        "resource_type": entry.resource_type,
        "resource_id": entry.resource_id,
        "metadata": entry.metadata,
        "created_at": entry.created_at.astimezone(UTC).isoformat(),
    }
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str
    ).encode("ascii")


def seal(previous: str, entry: AuditEntry) -> str:
    """The seal of ``entry`` following an entry sealed ``previous`` (GENESIS for the first)."""
    return hashlib.sha256(previous.encode("ascii") + canonical(entry)).hexdigest()


@attrs.frozen
class SealedEntry:
    """An entry as stored with its position in the chain and its seal."""

    id: int
    entry: AuditEntry
    previous: str
    seal: str


class BreakKind(enum.StrEnum):
    ALTERED = "altered"  # the entry's content no longer matches its seal
    UNLINKED = "unlinked"  # the entry does not follow the one before it: removed or reordered


@attrs.frozen
class ChainBreak:
    """Where verification failed: the first entry that does not hold."""

    entry_id: int
    kind: BreakKind
    detail: str


def entry_break(previous: str, stored: SealedEntry) -> ChainBreak | None:
    """None when ``stored``, which must follow the entry sealed ``previous``, holds; else how
    it breaks the chain."""
    if stored.previous != previous:
        return ChainBreak(
            stored.id,
            BreakKind.UNLINKED,
            "does not follow the previous entry: an entry before it was removed or moved",
        )
    if seal(stored.previous, stored.entry) != stored.seal:
        return ChainBreak(stored.id, BreakKind.ALTERED, "content differs from its seal")
    return None


def first_break(entries: Iterable[SealedEntry]) -> ChainBreak | None:
    """Walk sealed entries in chain order; None when the whole chain holds."""
    expected_previous = GENESIS
    for stored in entries:
        broken = entry_break(expected_previous, stored)
        if broken is not None:
            return broken
        expected_previous = stored.seal
    return None

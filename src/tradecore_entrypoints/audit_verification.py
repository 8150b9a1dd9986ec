"""``tradecore admin verify-audit``: walk the sealed audit chain and name the first entry that
does not hold (see docs/security.md, "The audit chain"). After retention dropped the oldest
months (docs/operations.md, "Partitions and retention"), the walk starts at the anchor the
retention job recorded."""

from __future__ import annotations

from typing import Any

from tradecore.audit_chain import GENESIS, entry_break
from tradecore.ports.repositories import AuditLog
from tradecore_adapters.postgres import PostgresAuditLog, open_pool
from tradecore_adapters.postgres.audit import AuditAnchor

VERIFY_BATCH = 1000
VERIFY_STATEMENT_TIMEOUT_S = 60.0


def is_seal(text: str) -> bool:
    """Whether ``text`` has the form of a seal: 64 lowercase hexadecimal characters."""
    return len(text) == len(GENESIS) and all(c in "0123456789abcdef" for c in text)


async def verify_audit_chain(
    audit: AuditLog,
    *,
    expect_head: str | None = None,
    batch: int = VERIFY_BATCH,
    anchor: AuditAnchor | None = None,
) -> dict[str, Any]:
    """Walk the chain of any AuditLog oldest first, ``batch`` entries at a time.
    ``{"ok": true, "entries", "head"}`` (head: the newest seal, GENESIS for an empty log)
    when every entry holds and, with ``expect_head``, the chain still holds the entry sealed
    so; else ``{"ok": false, "entry_id", "kind", "detail"}`` for the first entry that does
    not (kind ``altered`` or ``unlinked``; ``missing`` with entry_id None when the expected
    entry is gone).

    With ``anchor`` (retention removed the oldest entries) the walk starts after the
    anchor's entry, from its seal instead of GENESIS: the oldest retained entry must carry
    that seal, so an entry removed after the anchor is still ``unlinked``. A successful
    answer then also says ``"anchor"``: from where it verified and why."""
    previous = GENESIS if anchor is None else anchor.seal
    after, count = (0 if anchor is None else anchor.last_id), 0
    seen = expect_head is None or expect_head == previous
    while entries := await audit.chain(after_id=after, limit=batch):
        for stored in entries:
            broken = entry_break(previous, stored)
            if broken is not None:
                return {
                    "ok": False,
                    "entry_id": broken.entry_id,
                    "kind": broken.kind.value,
                    "detail": broken.detail,
                }
            previous, after, count = stored.seal, stored.id, count + 1
            seen = seen or stored.seal == expect_head
    if not seen:
        detail = (
            "no entry carries the expected head: entries were removed from the end "
            "of the chain, or the chain was sealed anew"
        )
        if anchor is not None:
            detail += " (or retention removed it: pass a head recorded after the anchor)"
        return {"ok": False, "entry_id": None, "kind": "missing", "detail": detail}
    verified: dict[str, Any] = {"ok": True, "entries": count, "head": previous}
    if anchor is not None:
        verified["anchor"] = {
            "last_id": anchor.last_id,
            "seal": anchor.seal,
            "retained_from": anchor.retained_from.isoformat(),
            "detail": f"entries up to id {anchor.last_id} were removed by retention; the chain "
            "was verified from the oldest retained entry, which follows the anchor's seal",
        }
    return verified


async def verify_audit_database(
    database_url: str, expect_head: str | None = None, *, timeout_s: float = 5.0
) -> dict[str, Any]:
    """``verify_audit_chain`` over the Postgres audit log at ``database_url``, on a pool of
    its own (one connection, a long statement timeout; no Redis needed). Without
    ``expect_head`` the head the database stores (the seal every append moves by
    compare-and-set) is expected, read before the walk so entries appended meanwhile do not
    matter: rows deleted from the end of the chain leave that head naming a missing entry.
    Raises ``DatabaseUnavailable`` when it cannot be read within the timeouts."""
    pool = await open_pool(
        database_url,
        min_size=1,
        max_size=1,
        timeout_s=timeout_s,
        statement_timeout_s=VERIFY_STATEMENT_TIMEOUT_S,
    )
    try:
        audit = PostgresAuditLog(pool)
        expected = expect_head if expect_head is not None else await audit.stored_head()
        anchor = await audit.retention_anchor()
        return await verify_audit_chain(audit, expect_head=expected, anchor=anchor)
    finally:
        await pool.close()

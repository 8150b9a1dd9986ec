"""``tradecore admin verify-audit`` against a real Postgres database: an intact chain is
reported with its newest seal; a row changed or removed with plain SQL is named; the batched
walk agrees with ``first_break`` on any chain and any tampering."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import attrs
import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tradecore.audit import AuditAction, AuditEntry, RequestContext
from tradecore.audit_chain import GENESIS, SealedEntry, first_break, seal
from tradecore_adapters.postgres import Pool, PostgresAuditLog
from tradecore_entrypoints.audit_verification import verify_audit_chain

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
TRADECORE = Path(sys.executable).parent / "tradecore"
SECRETS = {
    "JWT_SECRET": "verify-audit-test-jwt-secret-0123456789abcdef",
    "ENCRYPTION_KEY": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8",
}


def entry(n: int) -> AuditEntry:
    return AuditEntry(
        user_id=f"user-{n % 2}",
        action=AuditAction.WEBHOOK_CREDENTIAL_ATTACK if n % 2 else AuditAction.LOGIN,
        success=n % 2 == 0,
        context=RequestContext(f"203.0.113.{n}", "curl/8", "/webhook/<token>/order", "POST"),
        created_at=T0 + timedelta(seconds=n),
        error_message=None if n % 2 == 0 else "wrong secret",
        metadata={"attack_type": "wrong_secret", "trading_account_id": f"acct-{n}"},
    )


def database_url(conninfo: str) -> str:
    """The ``postgresql://`` URL of a key=value conninfo (DATABASE_URL takes URLs only)."""
    parts = psycopg.conninfo.conninfo_to_dict(conninfo)
    user = quote(str(parts.get("user", "postgres")), safe="")
    password = parts.get("password")
    auth = user + (f":{quote(str(password), safe='')}" if password else "")
    host, port = parts.get("host", "127.0.0.1"), parts.get("port", 5432)
    return f"postgresql://{auth}@{host}:{port}/{parts['dbname']}"


async def run_cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        str(TRADECORE),
        *args,
        env={"PATH": os.environ.get("PATH", ""), **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def verify(conninfo: str, *args: str) -> tuple[int, dict[str, Any]]:
    """Run the command; its exit status and its one JSON line."""
    status, out, err = await run_cli(
        "admin", "verify-audit", *args, env={"DATABASE_URL": database_url(conninfo), **SECRETS}
    )
    assert err == ""
    (line,) = out.splitlines()
    return status, json.loads(line)


async def sealed_log(pool: Pool, n: int = 5) -> list[SealedEntry]:
    audit = PostgresAuditLog(pool)
    for i in range(1, n + 1):
        await audit.append(entry(i))
    return await audit.chain()


async def execute(pool: Pool, statement: str, *params: Any) -> None:
    async with pool.connection() as conn:
        await conn.execute(statement, params)


@pytest.mark.postgres
async def test_intact_chain_is_ok_and_prints_the_newest_seal(
    pg_pool: Pool, pg_conninfo: str
) -> None:
    sealed = await sealed_log(pg_pool)

    status, result = await verify(pg_conninfo)

    assert status == 0
    assert result == {"ok": True, "entries": 5, "head": sealed[-1].seal}


@pytest.mark.postgres
async def test_empty_log_is_ok_with_the_genesis_head(pg_pool: Pool, pg_conninfo: str) -> None:
    status, result = await verify(pg_conninfo)

    assert (status, result) == (0, {"ok": True, "entries": 0, "head": GENESIS})


@pytest.mark.postgres
async def test_metadata_changed_with_sql_is_reported_altered(
    pg_pool: Pool, pg_conninfo: str
) -> None:
    await sealed_log(pg_pool)
    await execute(
        pg_pool,
        "UPDATE audit_logs SET metadata = jsonb_set(metadata, '{trading_account_id}', "
        "'\"acct-forged\"') WHERE id = 3",
    )

    status, result = await verify(pg_conninfo)

    assert status == 1
    assert result["ok"] is False
    assert (result["entry_id"], result["kind"]) == (3, "altered")
    assert result["detail"]


@pytest.mark.postgres
async def test_deleted_middle_row_is_reported_at_the_next_id_unlinked(
    pg_pool: Pool, pg_conninfo: str
) -> None:
    await sealed_log(pg_pool)
    await execute(pg_pool, "DELETE FROM audit_logs WHERE id = 3")

    status, result = await verify(pg_conninfo)

    assert status == 1
    assert (result["ok"], result["entry_id"], result["kind"]) == (False, 4, "unlinked")


@pytest.mark.postgres
async def test_removed_newest_row_is_caught_with_the_recorded_head(
    pg_pool: Pool, pg_conninfo: str
) -> None:
    await sealed_log(pg_pool)
    _, before = await verify(pg_conninfo)
    assert (await verify(pg_conninfo, "--expect-head", before["head"]))[0] == 0
    await execute(pg_pool, "DELETE FROM audit_logs WHERE id = 5")

    # the head recorded elsewhere catches it ...
    status, result = await verify(pg_conninfo, "--expect-head", before["head"])
    assert status == 1
    assert (result["ok"], result["entry_id"], result["kind"]) == (False, None, "missing")


@pytest.mark.postgres
async def test_removed_newest_rows_are_caught_by_the_stored_head(
    pg_pool: Pool, pg_conninfo: str
) -> None:
    """Issue 16, 6: without --expect-head the head the database stores is checked."""
    await sealed_log(pg_pool)
    await execute(pg_pool, "DELETE FROM audit_logs WHERE id >= 4")

    status, result = await verify(pg_conninfo)

    assert status == 1
    assert (result["ok"], result["entry_id"], result["kind"]) == (False, None, "missing")


@pytest.mark.postgres
@pytest.mark.parametrize("batch", [1, 2, 3, 1000])
async def test_the_walk_carries_the_link_across_batches(pg_pool: Pool, batch: int) -> None:
    sealed = await sealed_log(pg_pool, 7)
    audit = PostgresAuditLog(pg_pool)
    assert await verify_audit_chain(audit, batch=batch) == {
        "ok": True,
        "entries": 7,
        "head": sealed[-1].seal,
    }
    await execute(pg_pool, "DELETE FROM audit_logs WHERE id = 3")
    unlinked = await verify_audit_chain(audit, batch=batch)
    assert (unlinked["entry_id"], unlinked["kind"]) == (4, "unlinked")
    await execute(pg_pool, "UPDATE audit_logs SET success = NOT success WHERE id = 2")
    altered = await verify_audit_chain(audit, batch=batch)
    assert (altered["entry_id"], altered["kind"]) == (2, "altered")


def test_embedded_default_has_nothing_to_verify() -> None:
    status, out, err = asyncio.run(run_cli("admin", "verify-audit", env={}))

    assert status == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("tradecore: verify-audit needs DATABASE_URL")


@pytest.mark.postgres
async def test_unmigrated_database_is_refused_with_one_line(fresh_pg_database: str) -> None:
    status, out, err = await run_cli(
        "admin",
        "verify-audit",
        env={"DATABASE_URL": database_url(fresh_pg_database), **SECRETS},
    )

    assert (status, out) == (2, "")
    assert err.strip() == "tradecore: the audit log tables are missing: run `tradecore migrate`"


def test_unreachable_database_is_one_line_and_exit_2() -> None:
    env = {"DATABASE_URL": "postgresql://postgres:pw-not-shown@127.0.0.1:1/none", **SECRETS}
    status, out, err = asyncio.run(run_cli("admin", "verify-audit", env=env))

    assert (status, out) == (2, "")
    (line,) = err.strip().splitlines()
    assert line.startswith("tradecore: cannot read the audit log: ")
    assert "pw-not-shown" not in err


def test_a_malformed_expected_head_is_refused() -> None:
    env = {"DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none", **SECRETS}
    status, _, err = asyncio.run(run_cli("admin", "verify-audit", "--expect-head", "x", env=env))

    assert status == 2
    assert "--expect-head must be a seal" in err


# --- the batched walk agrees with first_break -------------------------------------------------


@attrs.define
class ListChain:
    """An AuditLog's ``chain()`` over a list of sealed entries, tampered with at will."""

    entries: list[SealedEntry]

    async def chain(self, *, after_id: int = 0, limit: int = 1000) -> list[SealedEntry]:
        return [s for s in self.entries if s.id > after_id][:limit]


def sealed_chain(n: int) -> list[SealedEntry]:
    sealed: list[SealedEntry] = []
    previous = GENESIS
    for i in range(1, n + 1):
        current = seal(previous, entry(i))
        sealed.append(SealedEntry(i, entry(i), previous, current))
        previous = current
    return sealed


TAMPERING = st.sampled_from(["none", "alter", "delete", "swap", "reseal"])


@given(n=st.integers(1, 25), batch=st.integers(1, 8), how=TAMPERING, data=st.data())
def test_batched_walk_matches_first_break(
    n: int, batch: int, how: str, data: st.DataObject
) -> None:
    entries = sealed_chain(n)
    k = data.draw(st.integers(0, n - 1), label="k")
    if how == "alter":
        changed = attrs.evolve(entries[k].entry, error_message="rewritten")
        entries[k] = attrs.evolve(entries[k], entry=changed)
    elif how == "delete":
        del entries[k]
    elif how == "swap" and k + 1 < n:
        # two entries trade places; ids follow the store's order, the seals do not
        entries[k], entries[k + 1] = entries[k + 1], entries[k]
        entries = [attrs.evolve(s, id=i + 1) for i, s in enumerate(entries)]
    elif how == "reseal":
        # the content is changed and sealed again: the next entry no longer links to it
        changed = attrs.evolve(entries[k].entry, user_id="intruder")
        entries[k] = attrs.evolve(
            entries[k], entry=changed, seal=seal(entries[k].previous, changed)
        )

    result = asyncio.run(verify_audit_chain(ListChain(entries), batch=batch))  # type: ignore[arg-type]

    expected = first_break(entries)
    if expected is None:
        head = entries[-1].seal if entries else GENESIS
        assert result == {"ok": True, "entries": len(entries), "head": head}
    else:
        assert result["ok"] is False
        assert (result["entry_id"], result["kind"]) == (expected.entry_id, expected.kind.value)
    detectable = how == "alter" or (how == "reseal" and k < n - 1) or (how == "swap" and k < n - 1)
    if detectable:
        assert result["ok"] is False

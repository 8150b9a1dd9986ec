"""The monthly partitions of ``order_history`` and ``audit_logs`` (migration 0010): created
ahead of time, rows moved out of the DEFAULT partition, months past retention dropped.

``maintain_partitions`` is the whole job (``tradecore partitions``; ``tradecore migrate`` runs
it without retention). It is idempotent, and safe to run from several hosts at once: a run
holds a session advisory lock, so a second run waits for the first and then finds nothing left
to do. Each partition is changed in a transaction of its own, under a lock timeout, so the job
never queues the order path behind a long query for more than ``lock_timeout_s``: a step that
cannot get its lock fails the run with ``DatabaseUnavailable`` and leaves that partition as it
was (run again).

* **Ahead.** Every table has a partition for the current UTC month and the next
  ``months_ahead``, and one for every month that has rows in the DEFAULT partition (rows that
  arrived while no partition covered their month: they are moved into it in the same
  transaction that attaches it, so the DEFAULT partition is empty after a run).
* **Retention.** With ``keep_months`` N, a month is dropped once it ended at least N whole
  months before the current month began (so nothing younger than N months is ever dropped,
  and a month goes at most one month later than that). ``None`` keeps a table forever.
* **Orders.** A month that still holds an order not in a final status is kept (reported in
  ``kept_open``), since a worker may still write it. The month's rows in ``order_keys`` are
  deleted with it.
* **Audit log.** Months are dropped oldest first. The newest entry of a dropped month becomes
  the chain's anchor (``audit_chain_anchor``: its id and seal), and entries with a lower id in
  later months (appended a moment later across the month boundary, with an earlier id) go
  with it, so the retained entries are exactly the chain after the anchor and ``verify-audit``
  checks them from the anchor's seal.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import attrs
import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from tradecore.audit_chain import GENESIS
from tradecore.orders import OrderStatus
from tradecore_adapters.postgres.audit import AuditAnchor
from tradecore_adapters.postgres.errors import translated
from tradecore_adapters.postgres.pool import connection_options

ORDERS = "order_history"
AUDIT = "audit_logs"
PARTITIONED = (ORDERS, AUDIT)
MONTHS_AHEAD = 2
"""Months created after the current one: two, so a missed monthly run loses nothing."""
_LOCK_KEY = 0x7472_6164_6570_6172  # "tradepar": the lock every run of the job holds
_OPEN_STATUSES = tuple(sorted(s.value for s in OrderStatus if not s.is_terminal))
_BOUNDS = re.compile(r"FOR VALUES FROM \('([^']+)'\) TO \('([^']+)'\)")


class PartitioningMissing(Exception):
    """The tables are not partitioned: the database is older than migration 0010."""


@attrs.frozen
class Retention:
    """Whole months each table keeps; None keeps it forever."""

    order_history: int | None = None
    audit_logs: int | None = None

    def __attrs_post_init__(self) -> None:
        for months in (self.order_history, self.audit_logs):
            if months is not None and months < 1:
                raise ValueError("a retention is at least 1 month (or forever)")


@attrs.frozen
class Maintenance:
    """What a run did."""

    created: tuple[str, ...] = ()
    moved_from_default: int = 0
    dropped: tuple[str, ...] = ()
    kept_open: tuple[str, ...] = ()
    audit_removed_across_boundary: int = 0
    audit_anchor: AuditAnchor | None = None

    def as_json(self) -> dict[str, object]:
        anchor = self.audit_anchor
        return {
            "created": list(self.created),
            "moved_from_default": self.moved_from_default,
            "dropped": list(self.dropped),
            "kept_open": list(self.kept_open),
            "audit_removed_across_boundary": self.audit_removed_across_boundary,
            "audit_anchor": None
            if anchor is None
            else {
                "last_id": anchor.last_id,
                "seal": anchor.seal,
                "retained_from": anchor.retained_from.isoformat(),
            },
        }


def month_start(moment: datetime) -> datetime:
    """The first instant (UTC) of the UTC month ``moment`` is in."""
    utc = moment.astimezone(UTC)
    return datetime(utc.year, utc.month, 1, tzinfo=UTC)


def add_months(month: datetime, months: int) -> datetime:
    """The first instant of the month ``months`` after (or before) ``month``'s."""
    index = month.year * 12 + month.month - 1 + months
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def partition_name(table: str, month: datetime) -> str:
    return f"{table}_{month.year:04d}_{month.month:02d}"


def _bound(month: datetime) -> str:
    """A partition bound as text: the UTC midnight, with its offset (no session time zone
    can shift it)."""
    return f"{month:%Y-%m-%d} 00:00:00+00"


@attrs.frozen
class _Partition:
    name: str
    lower: datetime | None  # None: the DEFAULT partition
    upper: datetime | None


Conn = psycopg.AsyncConnection[TupleRow]


async def _partitions(conn: Conn, table: str) -> list[_Partition]:
    """The table's partitions, the DEFAULT one last (the session's time zone is UTC)."""
    cursor = await conn.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
        " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
        (table,),
    )
    found = []
    for name, bound in await cursor.fetchall():
        match = _BOUNDS.fullmatch(str(bound))
        if match is None:
            found.append(_Partition(str(name), None, None))
        else:
            lower, upper = (datetime.fromisoformat(b) for b in match.groups())
            found.append(_Partition(str(name), lower, upper))
    return sorted(found, key=lambda p: (p.lower is None, p.lower))


def _default(partitions: list[_Partition]) -> _Partition | None:
    return next((p for p in partitions if p.lower is None), None)


async def _check_partitioned(conn: Conn) -> None:
    cursor = await conn.execute(
        "SELECT count(*) FROM pg_class WHERE oid = ANY(ARRAY[%s, %s]::regclass[])"
        " AND relkind = 'p'",
        PARTITIONED,
    )
    row = await cursor.fetchone()
    if row is None or row[0] != len(PARTITIONED):
        raise PartitioningMissing(
            "order_history and audit_logs are not partitioned: run `tradecore migrate`"
        )


async def _months_in_default(conn: Conn, default: _Partition) -> list[datetime]:
    cursor = await conn.execute(
        sql.SQL(
            "SELECT DISTINCT date_trunc('month', created_at AT TIME ZONE 'UTC') FROM {}"
        ).format(sql.Identifier(default.name))
    )
    return [datetime.fromisoformat(str(m)).replace(tzinfo=UTC) for (m,) in await cursor.fetchall()]


async def _create_month(conn: Conn, table: str, month: datetime, default: _Partition | None) -> int:
    """Create and attach ``table``'s partition for ``month``, moving its rows out of the
    DEFAULT partition in the same transaction; the number of rows moved."""
    name = sql.Identifier(partition_name(table, month))
    parent = sql.Identifier(table)
    lower, upper = month, add_months(month, 1)
    moved = 0
    async with conn.transaction():
        # the same columns, defaults, NOT NULLs and CHECKs; attaching adds the indexes,
        # foreign keys and triggers of the parent
        await conn.execute(
            sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)").format(
                name, parent
            )
        )
        if default is not None:
            # no insert may slip into the DEFAULT partition between the move and the attach
            default_name = sql.Identifier(default.name)
            await conn.execute(
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(default_name)
            )
            cursor = await conn.execute(
                sql.SQL(
                    "WITH moved AS (DELETE FROM {} WHERE created_at >= %s AND created_at < %s"
                    " RETURNING *) INSERT INTO {} SELECT * FROM moved"
                ).format(default_name, name),
                (lower, upper),
            )
            moved = cursor.rowcount
        await conn.execute(
            sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})").format(
                parent, name, sql.Literal(_bound(lower)), sql.Literal(_bound(upper))
            )
        )
    return moved


async def _drop(conn: Conn, table: str, partition: _Partition) -> None:
    await conn.execute(
        sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(
            sql.Identifier(table), sql.Identifier(partition.name)
        )
    )
    await conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(partition.name)))


async def _drop_orders(conn: Conn, partition: _Partition) -> bool:
    """Drop an order month unless it holds an open order; whether it was dropped."""
    name = sql.Identifier(partition.name)
    async with conn.transaction():
        cursor = await conn.execute(
            sql.SQL("SELECT EXISTS (SELECT FROM {} WHERE status = ANY(%s))").format(name),
            (list(_OPEN_STATUSES),),
        )
        row = await cursor.fetchone()
        if row is not None and row[0]:
            return False
        await conn.execute(
            sql.SQL("DELETE FROM order_keys k USING {} o WHERE k.id = o.id").format(name)
        )
        await _drop(conn, ORDERS, partition)
    return True


async def _drop_audit(conn: Conn, partition: _Partition) -> tuple[int, AuditAnchor | None]:
    """Drop an audit month, moving the chain's anchor to its newest entry; the number of
    later-month entries removed with it, and the new anchor (None for an empty month)."""
    assert partition.upper is not None
    removed, anchor = 0, None
    async with conn.transaction():
        cursor = await conn.execute(
            sql.SQL("SELECT id, seal FROM {} ORDER BY id DESC LIMIT 1").format(
                sql.Identifier(partition.name)
            )
        )
        newest = await cursor.fetchone()
        if newest is not None:
            last_id, seal = int(str(newest[0])), str(newest[1] or GENESIS)
            cursor = await conn.execute(
                "DELETE FROM audit_logs WHERE id <= %s AND created_at >= %s",
                (last_id, partition.upper),
            )
            removed = cursor.rowcount
            cursor = await conn.execute(
                "INSERT INTO audit_chain_anchor AS a (last_id, seal, retained_from)"
                " VALUES (%s, %s, %s) ON CONFLICT (singleton) DO UPDATE"
                " SET last_id = EXCLUDED.last_id, seal = EXCLUDED.seal,"
                " retained_from = EXCLUDED.retained_from, recorded_at = now()"
                " WHERE a.last_id < EXCLUDED.last_id RETURNING 1",
                (last_id, seal, partition.upper),
            )
            if await cursor.fetchone() is not None:
                anchor = AuditAnchor(last_id, seal, partition.upper)
        await _drop(conn, AUDIT, partition)
    return removed, anchor


async def _ahead(conn: Conn, current: datetime, months_ahead: int) -> tuple[list[str], int]:
    """Create the missing months (module doc, "Ahead"); their names and the rows moved."""
    created: list[str] = []
    moved = 0
    for table in PARTITIONED:
        partitions = await _partitions(conn, table)
        default = _default(partitions)
        covered = {p.lower for p in partitions if p.lower is not None}
        wanted = {add_months(current, n) for n in range(months_ahead + 1)}
        if default is not None:
            wanted |= set(await _months_in_default(conn, default))
        for month in sorted(wanted - covered):
            moved += await _create_month(conn, table, month, default)
            created.append(partition_name(table, month))
    return created, moved


async def _retain(conn: Conn, current: datetime, retention: Retention) -> Maintenance:
    """Drop the months past retention (module doc, "Retention"), oldest first."""
    dropped: list[str] = []
    kept_open: list[str] = []
    removed = 0
    anchor: AuditAnchor | None = None
    for table, keep in ((ORDERS, retention.order_history), (AUDIT, retention.audit_logs)):
        if keep is None:
            continue
        cutoff = add_months(current, -keep)
        for partition in await _partitions(conn, table):
            if partition.upper is None or partition.upper > cutoff:
                continue
            if table == ORDERS:
                kept = not await _drop_orders(conn, partition)
                (kept_open if kept else dropped).append(partition.name)
                continue
            count, moved_anchor = await _drop_audit(conn, partition)
            removed += count
            anchor = moved_anchor or anchor
            dropped.append(partition.name)
    return Maintenance(
        dropped=tuple(dropped),
        kept_open=tuple(kept_open),
        audit_removed_across_boundary=removed,
        audit_anchor=anchor,
    )


@translated
async def maintain_partitions(
    conninfo: str,
    *,
    now: datetime,
    retention: Retention | None = None,
    months_ahead: int = MONTHS_AHEAD,
    timeout_s: float = 10.0,
    lock_timeout_s: float = 5.0,
) -> Maintenance:
    """Run the job (module doc) as of ``now``; without ``retention`` nothing is dropped.
    Raises ``PartitioningMissing`` before migration 0010, ``DatabaseUnavailable`` when the
    database cannot be reached or a lock not had within ``lock_timeout_s``."""
    options = connection_options(timeout_s, statement_timeout_s=600.0)
    current = month_start(now)
    async with await psycopg.AsyncConnection.connect(conninfo, **options) as conn:
        # Another run holds the lock: wait for it (the session's end releases the lock).
        await conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        await conn.execute(
            sql.SQL("SET lock_timeout = {}").format(
                sql.Literal(f"{max(1, round(lock_timeout_s * 1000))}ms")
            )
        )
        await _check_partitioned(conn)
        created, moved = await _ahead(conn, current, months_ahead)
        dropping = Maintenance() if retention is None else await _retain(conn, current, retention)
    return attrs.evolve(dropping, created=tuple(created), moved_from_default=moved)

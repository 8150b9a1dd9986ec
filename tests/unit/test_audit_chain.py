"""The audit chain names the first altered, removed or reordered entry."""

from __future__ import annotations

from datetime import timedelta

import attrs
from hypothesis import given
from hypothesis import strategies as st

from tradecore.audit import AuditAction, AuditEntry, RequestContext
from tradecore.audit_chain import GENESIS, BreakKind, SealedEntry, first_break, seal
from tradecore.testing.clock import EPOCH

CONTEXT = RequestContext("198.51.100.66", "curl/8", "/webhook/x/order", "POST")


def entry(n: int, action: AuditAction = AuditAction.WEBHOOK_ORDER) -> AuditEntry:
    return AuditEntry(
        user_id=f"user-{n % 3}",
        action=action,
        success=n % 2 == 0,
        context=CONTEXT,
        created_at=EPOCH + timedelta(seconds=n),
        metadata={"trading_account_id": f"acct-{n}", "n": n},
    )


def chain(entries: list[AuditEntry]) -> list[SealedEntry]:
    sealed, previous = [], GENESIS
    for i, e in enumerate(entries, 1):
        current = seal(previous, e)
        sealed.append(SealedEntry(i, e, previous, current))
        previous = current
    return sealed


def test_an_untouched_chain_holds() -> None:
    assert first_break(chain([entry(n) for n in range(20)])) is None
    assert first_break([]) is None


def test_an_altered_field_is_named() -> None:
    sealed = chain([entry(n) for n in range(10)])
    forged = attrs.evolve(sealed[4].entry, success=not sealed[4].entry.success)
    sealed[4] = attrs.evolve(sealed[4], entry=forged)

    found = first_break(sealed)

    assert found is not None and (found.entry_id, found.kind) == (5, BreakKind.ALTERED)


def test_a_removed_entry_breaks_the_link_of_the_next() -> None:
    sealed = chain([entry(n) for n in range(10)])
    del sealed[3]

    found = first_break(sealed)

    assert found is not None and (found.entry_id, found.kind) == (5, BreakKind.UNLINKED)


def test_reordered_entries_are_found() -> None:
    sealed = chain([entry(n) for n in range(10)])
    sealed[2], sealed[3] = sealed[3], sealed[2]

    found = first_break(sealed)

    assert found is not None and found.entry_id == 4 and found.kind is BreakKind.UNLINKED


@given(
    st.integers(min_value=1, max_value=15),
    st.data(),
)
def test_any_single_change_is_detected_at_its_entry(size: int, data: st.DataObject) -> None:
    sealed = chain([entry(n) for n in range(size)])
    index = data.draw(st.integers(min_value=0, max_value=size - 1))
    field = data.draw(st.sampled_from(["user_id", "action", "metadata", "created_at", "context"]))
    original = sealed[index].entry
    changed = {
        "user_id": "someone-else",
        "action": AuditAction.LOGIN,
        "metadata": {**original.metadata, "n": -1},
        "created_at": original.created_at + timedelta(microseconds=1),
        "context": attrs.evolve(original.context, ip_address="203.0.113.1"),
    }[field]
    sealed[index] = attrs.evolve(sealed[index], entry=attrs.evolve(original, **{field: changed}))

    found = first_break(sealed)

    assert found is not None and found.entry_id == index + 1

"""Contract of ``UserRepository.save`` and ``TradingAccountRepository.save``: a compare-and-set
on the fields that change (plus the named guards, plus ``deleted`` for accounts), writing only
those fields; memory and Postgres alike.

The scenarios are the read-modify-write races of the services: two requests read the same
row, each changes its own field, each saves with what it read as ``previous``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from decimal import Decimal

import attrs
import pytest
from test_repositories import Stores, account, memory_stores, postgres_stores, user

from tradecore.identity import Plan


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def stores(request: pytest.FixtureRequest) -> Stores:
    if request.param == "memory":
        return memory_stores()
    return postgres_stores(request.getfixturevalue("pg_pool"))


def blob(tag: str) -> bytes:
    """A stand-in ciphertext (the table wants at least a nonce and a tag: 29 bytes)."""
    return tag.encode().ljust(32, b".")


async def stored_account(stores: Stores, **changes: object) -> None:
    assert await stores.users.add(user(1))
    await stores.accounts.add(account(1, **changes))


# --- only the changed fields are written ---------------------------------------------------


async def test_account_save_writes_only_the_fields_that_differ(stores: Stores) -> None:
    """Every field the caller did not change keeps what is stored, even where the caller's
    copy is stale."""
    await stored_account(stores)
    stale = account(1)
    concurrent = attrs.evolve(
        stale,
        webhook_secret_hash="secret-new",
        webhook_token_hash="e" * 64,
        max_request_age=45,
        allowed_symbols=frozenset({"ES", "BTCUSDT"}),
        max_quantity=Decimal("2.50"),
        credentials_verified=True,
        encrypted_credentials=blob("sealed"),
    )
    assert await stores.accounts.save(concurrent, previous=stale) == concurrent

    saved = await stores.accounts.save(attrs.evolve(stale, name="Renamed"), previous=stale)

    expected = attrs.evolve(concurrent, name="Renamed")
    assert saved == expected
    assert await stores.accounts.get("acct-1") == expected
    assert await stores.token_owner("e" * 64) == (expected, user(1))


async def test_user_save_writes_only_the_fields_that_differ(stores: Stores) -> None:
    assert await stores.users.add(user(1))
    stale = user(1)
    expires = datetime(2031, 2, 3, 4, 5, 6, 7, tzinfo=UTC)
    concurrent = attrs.evolve(
        stale,
        password_hash="$argon2id$new",
        plan=Plan.FREE,
        disabled=True,
        subscription_expires_at=expires,
    )
    assert await stores.users.save(concurrent, previous=stale) == concurrent

    saved = await stores.users.save(
        attrs.evolve(stale, accepted_terms_version="2025-02"), previous=stale
    )

    expected = attrs.evolve(concurrent, accepted_terms_version="2025-02")
    assert saved == expected
    assert await stores.users.get("user-1") == expected
    assert await stores.users.by_email("TRADER1@example.com") == expected


async def test_a_save_that_changes_nothing_writes_nothing_and_answers_the_stored_row(
    stores: Stores,
) -> None:
    await stored_account(stores)
    renamed = account(1, name="Other")
    assert await stores.accounts.save(renamed, previous=account(1)) == renamed
    assert await stores.accounts.save(account(1), previous=account(1)) == renamed
    assert await stores.accounts.get("acct-1") == renamed
    assert await stores.users.save(user(1), previous=user(1)) == user(1)
    # a guard that no longer holds fails even when nothing changes
    assert await stores.accounts.save(account(1), previous=account(1), guard=["name"]) is None


# --- a concurrent change to another field survives -----------------------------------------


async def test_concurrent_changes_to_different_account_fields_both_survive(
    stores: Stores,
) -> None:
    """PATCH name beside "regenerate webhook secret": the new secret is never written back."""
    await stored_account(stores)
    read_by_patch = await stores.accounts.get("acct-1")
    read_by_regenerate = await stores.accounts.get("acct-1")
    assert read_by_patch is not None and read_by_regenerate is not None

    regenerated = attrs.evolve(read_by_regenerate, webhook_secret_hash="secret-new")
    assert await stores.accounts.save(regenerated, previous=read_by_regenerate)
    renamed = attrs.evolve(read_by_patch, name="Renamed")
    assert await stores.accounts.save(renamed, previous=read_by_patch)

    assert await stores.accounts.get("acct-1") == account(
        1, name="Renamed", webhook_secret_hash="secret-new"
    )


async def test_concurrent_changes_to_different_user_fields_both_survive(stores: Stores) -> None:
    """Accepting the terms beside a password reset: the new password hash stays."""
    assert await stores.users.add(user(1))
    read_by_terms = await stores.users.get("user-1")
    read_by_reset = await stores.users.get("user-1")
    assert read_by_terms is not None and read_by_reset is not None

    reset = attrs.evolve(read_by_reset, password_hash="$argon2id$new")
    assert await stores.users.save(reset, previous=read_by_reset)
    accepted = attrs.evolve(read_by_terms, accepted_terms_version="7")
    assert await stores.users.save(accepted, previous=read_by_terms)

    assert await stores.users.get("user-1") == user(
        1, password_hash="$argon2id$new", accepted_terms_version="7"
    )


# --- a compare-and-set on the same field loses and says so ---------------------------------


async def test_the_second_change_of_the_same_account_field_loses(stores: Stores) -> None:
    """Two secret regenerations from the same read: the second writes nothing."""
    await stored_account(stores)
    read = account(1)
    first = attrs.evolve(read, webhook_secret_hash="secret-first")
    second = attrs.evolve(read, webhook_secret_hash="secret-second", name="Also renamed")
    assert await stores.accounts.save(first, previous=read) == first

    assert await stores.accounts.save(second, previous=read) is None
    assert await stores.accounts.get("acct-1") == first


async def test_the_second_change_of_the_same_user_field_loses(stores: Stores) -> None:
    """A login's rehash of the old password after a reset: the reset's hash stays."""
    assert await stores.users.add(user(1))
    read = user(1)
    reset = attrs.evolve(read, password_hash="$argon2id$reset")
    assert await stores.users.save(reset, previous=read) == reset

    rehash = attrs.evolve(read, password_hash="$argon2id$rehash-of-old")
    assert await stores.users.save(rehash, previous=read) is None
    assert await stores.users.get("user-1") == reset


async def test_null_previous_values_are_compared_too(stores: Stores) -> None:
    """NULL compares as a value (IS NOT DISTINCT FROM), both to win and to lose."""
    await stored_account(stores)
    read = account(1)
    sealed = attrs.evolve(read, encrypted_credentials=blob("one"))
    assert await stores.accounts.save(sealed, previous=read) == sealed
    other = attrs.evolve(read, encrypted_credentials=blob("two"))
    assert await stores.accounts.save(other, previous=read) is None
    assert await stores.accounts.save(read, previous=sealed) == read
    assert await stores.users.add(user(2))
    expiring = user(2, subscription_expires_at=datetime(2030, 1, 1, tzinfo=UTC))
    assert await stores.users.save(expiring, previous=user(2)) == expiring
    assert await stores.users.save(user(2, plan=Plan.FREE), previous=user(2)) is not None
    again = user(2, subscription_expires_at=datetime(2040, 1, 1, tzinfo=UTC))
    assert await stores.users.save(again, previous=user(2)) is None


async def test_a_guard_field_must_hold_its_previous_value(stores: Stores) -> None:
    """Marking credentials verified guards the credentials it verified."""
    await stored_account(stores, encrypted_credentials=blob("old"))
    read = account(1, encrypted_credentials=blob("old"))
    replaced = attrs.evolve(read, encrypted_credentials=blob("new"))
    assert await stores.accounts.save(replaced, previous=read)

    verified = attrs.evolve(read, credentials_verified=True)
    guard = ("encrypted_credentials",)
    assert await stores.accounts.save(verified, previous=read, guard=guard) is None
    assert await stores.accounts.get("acct-1") == replaced
    fresh = attrs.evolve(replaced, credentials_verified=True)
    assert await stores.accounts.save(fresh, previous=replaced, guard=guard) == fresh


async def test_an_account_deleted_meanwhile_is_never_written(stores: Stores) -> None:
    await stored_account(stores, encrypted_credentials=blob("old"))
    read = account(1, encrypted_credentials=blob("old"))
    deleted = attrs.evolve(read, deleted=True, encrypted_credentials=None)
    assert await stores.accounts.save(deleted, previous=read) == deleted

    renamed = attrs.evolve(read, name="Renamed")
    assert await stores.accounts.save(renamed, previous=read) is None
    assert await stores.accounts.get("acct-1") is None
    # the deleted row is unchanged: a second delete from the stale read loses too
    assert await stores.accounts.save(deleted, previous=read) is None
    assert await stores.accounts.save(attrs.evolve(deleted, name="x"), previous=deleted)


async def test_saving_a_missing_record_reports_it(stores: Stores) -> None:
    assert await stores.users.save(user(1, disabled=True), previous=user(1)) is None
    assert await stores.users.get("user-1") is None
    assert await stores.accounts.save(account(1, name="x"), previous=account(1)) is None
    assert await stores.accounts.get("acct-1") is None


async def test_of_concurrent_saves_of_one_field_exactly_one_applies(stores: Stores) -> None:
    await stored_account(stores)
    read = account(1)
    attempts = [
        stores.accounts.save(attrs.evolve(read, webhook_secret_hash=f"s-{i}"), previous=read)
        for i in range(8)
    ]
    results = await asyncio.gather(*attempts)
    won = [r for r in results if r is not None]
    assert len(won) == 1
    assert await stores.accounts.get("acct-1") == won[0]


async def test_save_refuses_unknown_guards_and_another_records_previous(stores: Stores) -> None:
    await stored_account(stores)
    assert await stores.users.add(user(2))
    with pytest.raises(TypeError):
        await stores.accounts.save(account(1), previous=account(1), guard=["nope"])
    with pytest.raises(TypeError):
        await stores.users.save(user(1), previous=user(1), guard=["nope"])
    with pytest.raises(ValueError, match="previous is another record"):
        await stores.accounts.save(account(2), previous=account(1))
    with pytest.raises(ValueError, match="previous is another record"):
        await stores.users.save(user(2), previous=user(1))
    assert await stores.accounts.get("acct-1") == account(1)

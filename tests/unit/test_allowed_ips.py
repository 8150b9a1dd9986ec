"""AllowedIps: adding, listing and removing allowed-IP entries from a browser session, on the
memory adapters (``identity_world``)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st
from identity_world import (
    EMAIL,
    World,
    ctx,
    make_world,
    status,
    store_down,
)

from tradecore.audit import AuditAction
from tradecore.identity import AllowedIp, Plan, Session, User
from tradecore.netaddr import parse_allowed_entry
from tradecore.services.vocabulary import UNAVAILABLE, Principal, Rejected
from tradecore.testing.clock import EPOCH


@pytest.fixture
def world() -> World:
    return make_world()


# --- allowed IPs ----------------------------------------------------------------------------


async def test_allowed_ips_are_stored_normalized_and_duplicates_refused(world: World) -> None:
    user = await world.register()
    principal = await world.principal()
    added = await world.ips.add_allowed_ip(principal, " ::ffff:203.0.113.7 ", ctx())
    assert isinstance(added, AllowedIp) and added.ip_address == "203.0.113.7"
    duplicate = await world.ips.add_allowed_ip(principal, "203.0.113.7/32", ctx())
    assert isinstance(duplicate, Rejected) and duplicate.status == 409
    block = await world.ips.add_allowed_ip(principal, "10.0.0.0/8", ctx())
    assert isinstance(block, AllowedIp) and block.ip_address == "10.0.0.0/8"
    listed = await world.ips.list_allowed_ips(principal)
    assert isinstance(listed, list)
    assert [e.ip_address for e in listed] == ["203.0.113.7", "10.0.0.0/8"]
    assert all(e.user_id == user.id for e in listed)
    [*_, entry] = world.entries(AuditAction.ALLOWED_IP_ADDED)
    assert entry.entry.success and entry.entry.metadata == {"ip": "10.0.0.0/8"}


@pytest.mark.parametrize("text", ["nonsense", "10.0.0.1/8", "", None, 12, "300.1.1.1", "1.2.3.4 5"])
async def test_nonsense_addresses_are_400(world: World, text: object) -> None:
    await world.register()
    assert status(await world.ips.add_allowed_ip(await world.principal(), text, ctx())) == 400


@given(st.text(max_size=60))
def test_any_text_is_either_stored_in_its_parsed_form_or_refused(text: str) -> None:
    async def scenario() -> None:
        world = make_world(captcha_enabled=False)
        owner = User("u1", EMAIL, "unused", Plan.PRO, EPOCH)
        await world.users.add(owner)
        principal = Principal(owner, _session(), None, True, Plan.PRO)
        outcome = await world.ips.add_allowed_ip(principal, text, ctx())
        expected = parse_allowed_entry(text)
        if expected is None:
            assert status(outcome) == 400
        else:
            assert isinstance(outcome, AllowedIp) and outcome.ip_address == expected

    asyncio.run(scenario())


def _session() -> Session:
    return Session("s1", "u1", "csrf", "203.0.113.7", "ua", EPOCH)


async def test_removing_an_entry_is_limited_to_its_owner(world: World) -> None:
    await world.register()
    await world.register("bob@example.com")
    ada, bob = await world.principal(), await world.principal("bob@example.com")
    entry = await world.ips.add_allowed_ip(ada, "203.0.113.7", ctx())
    assert isinstance(entry, AllowedIp)
    assert status(await world.ips.remove_allowed_ip(bob, entry.id, ctx())) == 404
    assert await world.ips.remove_allowed_ip(ada, entry.id, ctx()) is None
    assert await world.ips.list_allowed_ips(ada) == []
    assert status(await world.ips.remove_allowed_ip(ada, entry.id, ctx())) == 404
    assert [e.entry.success for e in world.entries(AuditAction.ALLOWED_IP_REMOVED)] == [
        False,
        True,
        False,
    ]


async def test_the_allowed_ip_list_is_capped() -> None:
    world = make_world(max_entries=2)
    await world.register()
    principal = await world.principal()
    for text in ("192.0.2.1", "192.0.2.2"):
        assert isinstance(await world.ips.add_allowed_ip(principal, text, ctx()), AllowedIp)
    assert status(await world.ips.add_allowed_ip(principal, "192.0.2.3", ctx())) == 409


async def test_every_allowed_ip_call_answers_503_when_the_store_is_down(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    await world.register()
    principal = await world.principal()
    for method in ("list_for_user", "remove"):
        monkeypatch.setattr(world.allowed_ips, method, store_down)
    outcomes = [
        await world.ips.add_allowed_ip(principal, "203.0.113.7", ctx()),
        await world.ips.list_allowed_ips(principal),
        await world.ips.remove_allowed_ip(principal, "entry-1", ctx()),
    ]
    assert outcomes == [UNAVAILABLE] * 3

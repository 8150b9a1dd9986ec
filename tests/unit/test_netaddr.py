"""Client IP resolution through trusted proxies, normalization and allowlists."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tradecore.netaddr import (
    UNKNOWN_CLIENT_IP,
    client_ip,
    ip_allowed,
    normalize_ip,
    parse_allowed_entry,
    parse_trusted_proxies,
)

# --- normalize_ip ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("203.0.113.7", "203.0.113.7"),
        (" 203.0.113.7 ", "203.0.113.7"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("::FFFF:cb00:7107", "203.0.113.7"),
        ("2001:DB8:0:0::1", "2001:db8::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("::1", "::1"),
    ],
)
def test_normalize_ip(text: str, normalized: str) -> None:
    assert normalize_ip(text) == normalized


@pytest.mark.parametrize(
    "text",
    [
        "",
        "unknown",
        "256.1.1.1",
        "1.2.3",
        "010.1.1.1",
        "1.2.3.4:80",
        "[::1]",
        "1.2.3.4/32",
        "\u0661.2.3.4",
        "1.2.3.4\x00",
        "x" * 1000,
    ],
)
def test_malformed_addresses_normalize_to_none(text: str) -> None:
    assert normalize_ip(text) is None


@given(st.ip_addresses())
def test_normalization_is_idempotent_and_unwraps_mapped(address: object) -> None:
    text = str(address)
    normalized = normalize_ip(text)
    assert normalized is not None
    assert normalize_ip(normalized) == normalized
    parsed = ipaddress.ip_address(normalized)
    assert not (isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None)


# --- parse_trusted_proxies ------------------------------------------------------------------


def test_parse_trusted_proxies() -> None:
    networks = parse_trusted_proxies(
        " 10.0.0.1, 192.168.0.0/16,,::ffff:172.16.0.0/108,2001:db8::/32"
    )
    assert networks == (
        ipaddress.ip_network("10.0.0.1/32"),
        ipaddress.ip_network("192.168.0.0/16"),
        ipaddress.ip_network("172.16.0.0/12"),
        ipaddress.ip_network("2001:db8::/32"),
    )
    assert parse_trusted_proxies("") == ()


@pytest.mark.parametrize("text", ["10.0.0.1,proxy.local", "192.168.1.1/16", "10.0.0.0/33", "*"])
def test_bad_trusted_proxies_are_a_configuration_error(text: str) -> None:
    with pytest.raises(ValueError, match="TRUSTED_PROXIES"):
        parse_trusted_proxies(text)


# --- client_ip ------------------------------------------------------------------------------

TRUSTED = parse_trusted_proxies("10.0.0.0/8,192.168.1.1")
CLIENT = "203.0.113.7"
SPOOFED = "198.51.100.99"


def test_without_trusted_proxies_the_peer_is_the_client() -> None:
    assert client_ip(CLIENT, [SPOOFED], ()) == CLIENT


def test_xff_from_an_untrusted_peer_is_ignored() -> None:
    assert client_ip("198.51.100.1", [f"{SPOOFED}, 10.0.0.5"], TRUSTED) == "198.51.100.1"


def test_one_trusted_proxy() -> None:
    assert client_ip("10.0.0.5", [CLIENT], TRUSTED) == CLIENT


def test_the_rightmost_untrusted_hop_wins_over_a_spoofed_left_part() -> None:
    assert client_ip("10.0.0.5", [f"{SPOOFED}, {CLIENT}, 192.168.1.1"], TRUSTED) == CLIENT


def test_several_headers_are_one_list() -> None:
    headers = [f"{SPOOFED}", f"{CLIENT}", "10.9.9.9"]
    assert client_ip("10.0.0.5", headers, TRUSTED) == CLIENT


def test_malformed_entries_are_ignored() -> None:
    header = f"{SPOOFED}, {CLIENT}, unknown, , 999.1.1.1, _hidden"
    assert client_ip("10.0.0.5", [header], TRUSTED) == CLIENT


@pytest.mark.parametrize("entry", [f"{CLIENT}:51234", "[2001:db8::7]:443", "[2001:db8::7]"])
def test_entries_with_ports_and_brackets(entry: str) -> None:
    expected = normalize_ip(entry.rpartition("]")[0][1:] if entry.startswith("[") else CLIENT)
    assert client_ip("10.0.0.5", [entry], TRUSTED) == expected


def test_mapped_addresses_are_unwrapped_everywhere() -> None:
    assert client_ip("::ffff:10.0.0.5", ["::ffff:203.0.113.7"], TRUSTED) == CLIENT
    assert client_ip("::ffff:203.0.113.7", [], ()) == CLIENT


def test_all_hops_trusted_gives_the_leftmost() -> None:
    assert client_ip("10.0.0.5", ["10.1.1.1, 10.2.2.2"], TRUSTED) == "10.1.1.1"
    assert client_ip("10.0.0.5", [], TRUSTED) == "10.0.0.5"


@pytest.mark.parametrize("peer", [None, "", "garbage", "/tmp/socket"])
def test_unknown_peer(peer: str | None) -> None:
    assert client_ip(peer, [CLIENT], TRUSTED) == UNKNOWN_CLIENT_IP


trusted_hosts = st.sampled_from(["10.0.0.5", "10.200.1.1", "192.168.1.1", "::ffff:10.3.3.3"])


def _is_trusted(text: str) -> bool:
    normalized = normalize_ip(text)
    assert normalized is not None
    return any(ipaddress.ip_address(normalized) in net for net in TRUSTED)


untrusted_hosts = st.ip_addresses().map(str).filter(lambda s: not _is_trusted(s))
# No ASCII digit and no colon: cannot be an address in any notation.
garbage = st.text(max_size=20).filter(lambda s: not any(c in "0123456789:," for c in s))


@given(
    left=st.lists(st.one_of(untrusted_hosts, trusted_hosts, garbage), max_size=6),
    client=untrusted_hosts,
    right=st.lists(st.one_of(trusted_hosts, garbage), max_size=6),
    peer=trusted_hosts,
    split=st.integers(min_value=0, max_value=12),
)
def test_client_is_the_rightmost_untrusted_hop(
    left: list[str], client: str, right: list[str], peer: str, split: int
) -> None:
    chain = [*left, client, *right]
    headers = [", ".join(chain[:split]), ", ".join(chain[split:])]
    result = client_ip(peer, headers, TRUSTED)
    assert result == normalize_ip(client)
    assert not _is_trusted(result)


@given(st.one_of(st.none(), st.text()), st.lists(st.text()), st.sampled_from([(), TRUSTED]))
def test_client_ip_never_raises_and_answers_an_address(
    peer: str | None, headers: list[str], trusted: tuple[ipaddress.IPv4Network, ...]
) -> None:
    result = client_ip(peer, headers, trusted)
    assert normalize_ip(result) == result


# --- allowlists -----------------------------------------------------------------------------


def test_exact_and_cidr_entries() -> None:
    allowed = ["203.0.113.7", "198.51.100.0/24", "2001:db8::/32"]
    assert ip_allowed("203.0.113.7", allowed)
    assert ip_allowed("198.51.100.200", allowed)
    assert ip_allowed("2001:db8::42", allowed)
    assert not ip_allowed("203.0.113.8", allowed)
    assert not ip_allowed("198.51.101.1", allowed)


def test_mapped_client_matches_ipv4_entry_and_vice_versa() -> None:
    assert ip_allowed("::ffff:203.0.113.7", ["203.0.113.7"])
    assert ip_allowed("203.0.113.7", ["::ffff:203.0.113.7"])


@pytest.mark.parametrize("ip", ["", "garbage", UNKNOWN_CLIENT_IP])
def test_unknown_or_malformed_client_is_not_allowed(ip: str) -> None:
    assert not ip_allowed(ip, ["203.0.113.7", "garbage"])


def test_empty_allowlist_allows_nothing_by_itself() -> None:
    # "No entries means not configured" is the caller's rule; this function only matches.
    assert not ip_allowed(CLIENT, [])


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        (" 203.0.113.7 ", "203.0.113.7"),
        ("203.0.113.7/32", "203.0.113.7"),
        ("198.51.100.0/24", "198.51.100.0/24"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("2001:DB8::/32", "2001:db8::/32"),
        ("2001:db8::1/128", "2001:db8::1"),
    ],
)
def test_parse_allowed_entry(text: str, stored: str) -> None:
    assert parse_allowed_entry(text) == stored


@pytest.mark.parametrize("text", ["", "x", "198.51.100.1/24", "1.2.3.4/33", "1.2.3.4 5", None, 7])
def test_parse_allowed_entry_refuses_the_rest(text: object) -> None:
    assert parse_allowed_entry(text) is None


@given(st.ip_addresses())
def test_a_stored_address_allows_exactly_itself(address: object) -> None:
    entry = parse_allowed_entry(str(address))
    assert entry is not None
    assert ip_allowed(str(address), [entry])
    other = ipaddress.ip_address(int(ipaddress.ip_address(str(address))) ^ 1)
    assert not ip_allowed(str(other), [entry])

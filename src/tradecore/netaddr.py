"""Client addresses: normalization, the trusted-proxy walk of X-Forwarded-For, allowlists.

One normalized form serves the allowlist, the rate limiter and the audit log: the canonical
text of ``ipaddress``, IPv4-mapped IPv6 (``::ffff:1.2.3.4``) unwrapped to IPv4, IPv6 scope
ids dropped.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

UNKNOWN_CLIENT_IP = "0.0.0.0"  # noqa: S104 - a value, not a bind address
"""What ``client_ip`` answers when not even the peer address is known (a Unix socket)."""

_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_MAX_TEXT = 100  # longer than any address with a scope id we would keep


def _address(text: object) -> IPAddress | None:
    if not isinstance(text, str) or len(text) > _MAX_TEXT:
        return None
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.scope_id is not None:
            return ipaddress.IPv6Address(int(address))
    return address


def normalize_ip(text: str) -> str | None:
    """The normalized text of an IPv4 or IPv6 address, or None when ``text`` is not one."""
    address = _address(text)
    return None if address is None else str(address)


def _network(text: str, *, strict: bool) -> IPNetwork:
    """A network from an address or CIDR text, mapped IPv6 unwrapped; ValueError otherwise."""
    if len(text) > _MAX_TEXT:
        raise ValueError("too long")
    network = ipaddress.ip_network(text.strip(), strict=strict)
    if (
        isinstance(network, ipaddress.IPv6Network)
        and network.prefixlen >= _MAPPED.prefixlen
        and network.subnet_of(_MAPPED)
    ):
        base = int(network.network_address) & 0xFFFFFFFF
        return ipaddress.IPv4Network((base, network.prefixlen - _MAPPED.prefixlen))
    if isinstance(network, ipaddress.IPv6Network):  # drop a scope id
        return ipaddress.IPv6Network((int(network.network_address), network.prefixlen))
    return network


def parse_trusted_proxies(text: str) -> tuple[IPNetwork, ...]:
    """Networks from ``TRUSTED_PROXIES`` ("10.0.0.1,192.168.0.0/16"); empty items are skipped.
    Raises ValueError naming the bad item (host bits set in a CIDR block count as bad)."""
    networks: list[IPNetwork] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        try:
            networks.append(_network(item, strict=True))
        except ValueError as e:
            raise ValueError(f"TRUSTED_PROXIES: {item!r} is not an IP address or CIDR block") from e
    return tuple(networks)


def _is_port(text: str) -> bool:
    return 0 < len(text) <= 5 and text.isascii() and text.isdigit()


def _forwarded_entry(text: str) -> IPAddress | None:
    """One X-Forwarded-For item: an address, ``[v6]``, ``[v6]:port`` or ``v4:port``."""
    item = text.strip()
    if item.startswith("["):
        host, bracket, rest = item[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and _is_port(rest[1:]))):
            return None
        return _address(host)
    if item.count(":") == 1:
        host, _, port = item.partition(":")
        if not _is_port(port):
            return None
        address = _address(host)
        return address if isinstance(address, ipaddress.IPv4Address) else None
    return _address(item)


def _trusted(address: IPAddress, trusted: Sequence[IPNetwork]) -> bool:
    return any(address in network for network in trusted)


def client_ip(peer: str | None, forwarded_for: Sequence[str], trusted: Sequence[IPNetwork]) -> str:
    """The client address of a request, normalized.

    ``forwarded_for`` holds every X-Forwarded-For header value in order; together they are one
    comma-separated list. X-Forwarded-For is read only when ``peer`` is a trusted proxy; then
    the list is walked from the right while the hop we came from is trusted, and the first
    untrusted address is the client (if every hop is trusted, the leftmost one). Malformed
    items are ignored. Without a usable peer the answer is ``UNKNOWN_CLIENT_IP``. Never raises.
    """
    current = _address(peer)
    if current is None:
        return UNKNOWN_CLIENT_IP
    if not _trusted(current, trusted):
        return str(current)
    items = [
        item for header in forwarded_for if isinstance(header, str) for item in header.split(",")
    ]
    for item in reversed(items):
        hop = _forwarded_entry(item)
        if hop is None:
            continue
        current = hop
        if not _trusted(current, trusted):
            break
    return str(current)


def ip_allowed(ip: str, allowed: Iterable[str]) -> bool:
    """True when ``ip`` is one of ``allowed`` (addresses or CIDR blocks, compared normalized).
    A malformed ``ip`` is never allowed; malformed entries match nothing."""
    address = _address(ip)
    if address is None:
        return False
    for entry in allowed:
        if not isinstance(entry, str):
            continue
        try:
            network = _network(entry, strict=False)
        except ValueError:
            continue
        if address in network:
            return True
    return False


def parse_allowed_entry(text: object) -> str | None:
    """The stored form of an allowed-IP entry: a normalized address (a /32 or /128 block
    becomes its address) or a CIDR block; None for anything else, host bits set included."""
    if not isinstance(text, str):
        return None
    try:
        network = _network(text, strict=True)
    except ValueError:
        return None
    if network.num_addresses == 1:
        return str(network.network_address)
    return str(network)

"""Who a request comes from when it arrives through proxies: ``--forwarded-allow-ips``.

Behind a proxy every connection's peer is the proxy, so the per-client caps and the tenant
key would lump all clients together. A proxy appends the address it took a request from to
``X-Forwarded-For`` (or to RFC 7239's ``Forwarded: for=``), so the header's entries read left
to right from the client to the last proxy. Only the entries that trusted proxies appended
can be believed: the client may start the header with anything. So, as uvicorn and gunicorn
do, the header is read only when the direct peer is trusted, from the right, skipping the
trusted proxies' own addresses; the first untrusted entry is the client. From an untrusted
peer the header is ignored altogether, and with no proxy trusted (the default) every client
is its socket's address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from aiohttp import web

X_FORWARDED_FOR = "x-forwarded-for"
FORWARDED = "forwarded"
FORWARDED_HEADERS = (X_FORWARDED_FOR, FORWARDED)

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class TrustedProxies:
    """The peers whose forwarding header is believed: addresses and networks (CIDR), or
    ``*`` for every peer. ``header`` names the one header they write (``x-forwarded-for`` or
    ``forwarded``); the other is ignored, since a proxy passes through whichever one it does
    not write, forged or not."""

    def __init__(self, allow: Iterable[str] = (), header: str = X_FORWARDED_FOR) -> None:
        entries = [entry.strip() for entry in allow if entry.strip()]
        if header not in FORWARDED_HEADERS:
            raise ValueError(f"the forwarded header must be one of "
                             f"{', '.join(FORWARDED_HEADERS)}, got {header!r}")
        self.header = header
        self.everyone = "*" in entries
        self.networks: list[_Network] = [_network(entry) for entry in entries if entry != "*"]

    def __bool__(self) -> bool:
        return self.everyone or bool(self.networks)

    def trusts(self, host: str) -> bool:
        """Whether ``host`` (a peer's or a header entry's address) is a trusted proxy."""
        if self.everyone:
            return True
        address = _address(host)
        return address is not None and any(address in net for net in self.networks)

    def client_address(self, request: web.BaseRequest) -> str:
        """The address the request comes from: the peer's, unless the peer is a trusted
        proxy that names the client in its header."""
        peer = request.remote or ""
        if not self or not self.trusts(peer):
            return peer
        return self.client_in(self._chain(request)) or peer

    def client_in(self, chain: Sequence[str]) -> str | None:
        """The right-most untrusted entry of a forwarding chain (left-most if all are
        trusted); None for an empty chain."""
        hosts = [host for host in (_host(entry) for entry in chain) if host]
        for host in reversed(hosts):
            if not self.trusts(host):
                return host
        return hosts[0] if hosts else None

    def _chain(self, request: web.BaseRequest) -> list[str]:
        if self.header == FORWARDED:
            return [element.get("for", "") for element in request.forwarded]
        return [entry for value in request.headers.getall("X-Forwarded-For", ())
                for entry in value.split(",")]


def parse_allow_ips(text: str | None) -> list[str]:
    """``--forwarded-allow-ips``'s comma list as entries (checked by ``TrustedProxies``)."""
    return [entry.strip() for entry in (text or "").split(",") if entry.strip()]


def _network(entry: str) -> _Network:
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        raise ValueError(f"forwarded_allow_ips: {entry!r} is not an IP address, a network "
                         f"(CIDR) or '*'") from None


def _host(entry: str) -> str:
    """An entry's address without its port: ``1.2.3.4:80`` and ``[::1]:80`` as 1.2.3.4 and
    ::1; an entry that is not an address (``unknown``, an obfuscated ``_id``) as it is."""
    entry = entry.strip().strip('"')
    if entry.startswith("["):
        return entry[1:].partition("]")[0]
    if entry.count(":") == 1:
        return entry.partition(":")[0]
    return entry


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:a.b.c.d from a dual-stack socket
    return mapped if mapped is not None else address

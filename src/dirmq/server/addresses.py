"""Addresses: what `--listen` accepts (`HOST:PORT`, `[v6]:PORT`, `:PORT`), and whether an
address is this host's alone (protected mode: without credentials the server listens on, and
serves, loopback only)."""

from __future__ import annotations

import functools
import ipaddress
import re
import socket

from dirmq.errors import InvalidArgument

_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[v6]:PORT` or `:PORT` (all interfaces); port 0 picks a free port.
    `InvalidArgument` says what is wrong with anything else."""
    host, sep, port = text.rpartition(":")
    if not sep or not port:
        raise InvalidArgument(
            f"listen address {text!r} must be HOST:PORT (e.g. 127.0.0.1:8080, [::1]:8080 or :8080)"
        )
    if not (port.isascii() and port.isdigit()):
        raise InvalidArgument(f"listen address {text!r}: port {port!r} is not a number")
    if int(port) > 65535:
        raise InvalidArgument(
            f"listen address {text!r}: port {int(port)} is out of range "
            "(1-65535, or 0 for any free port)"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not _is_ip(host, 6):
            raise InvalidArgument(f"listen address {text!r}: [{host}] is not an IPv6 address")
    host = host or "0.0.0.0"
    if not (_is_ip(host, 4) or _is_ip(host, 6) or _is_host_name(host)):
        raise InvalidArgument(
            f"listen address {text!r}: {host!r} is not an IP address or a host name"
        )
    return host, int(port)


def _is_ip(host: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(host).version == version
    except ValueError:
        return False


def is_loopback_host(host: str) -> bool:
    """Whether listening on `host` (as `parse_address` returns it) reaches this host only: a
    loopback address, or a name all of whose addresses are loopback ones. A name that does not
    resolve is left to the bind to report."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return True
    addresses = {str(info[4][0]).partition("%")[0] for info in found}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def _is_host_name(host: str) -> bool:
    labels = host.rstrip(".").split(".")
    if all(label.isdigit() for label in labels):
        return False  # a malformed IPv4 address (999.1.1.1), not a name
    return len(host) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


def is_loopback_peer(peer: object) -> bool:
    """Whether a peer address (`peername`) is this host: 127/8, ::1, or IPv4-mapped 127/8. A
    peer that is no IP address (a Unix socket) is local too."""
    if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
        return True
    return _loopback_host(peer[0])


@functools.lru_cache(maxsize=1024)
def _loopback_host(host: str) -> bool:
    """`is_loopback_peer` of a peer's host, remembered: asked at every connection, and parsing
    the address was half of what taking a connection on cost (clients come from few hosts)."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback

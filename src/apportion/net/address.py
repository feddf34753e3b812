"""Addresses as users write them: ``tcp://host:port``, ``host:port`` or ``host``;
``tls://host:port`` for TLS; and ``inproc://name`` for a peer in this same process
(the in-memory transport)."""

from __future__ import annotations

import ipaddress
import re

DEFAULT_PORT = 8786

#: The forms every bad-address message names, so that the fix is in the error itself.
ACCEPTED_FORMS = "tcp://host:port, tls://host:port, host:port or host"

#: A host name or an IPv4 address; IPv6 literals go in brackets and are checked apart.
_HOST = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.\-]*[A-Za-z0-9_])?$")


#: The scheme of in-memory addresses, as Dask names its in-process transport.
INPROC = "inproc://"


class AddressError(ValueError):
    """An address that is not one of the accepted forms; the message is one line."""


def _bad(address: str, why: str) -> AddressError:
    return AddressError(f"invalid address {address!r}: {why}; use {ACCEPTED_FORMS}")


def check_host(host: str, address: str | None = None) -> str:
    """Return ``host`` if it is a host name, an IPv4 or an IPv6 address, else raise.

    ``address`` is what the user wrote, quoted in the error (default: ``host``).
    """
    if not host:
        why = "no host"
    elif ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            why = f"{host!r} is not an IPv6 address"
        else:
            return host
    elif _HOST.match(host):
        return host
    else:
        why = f"{host!r} is not a host name"
    if address is None:
        raise AddressError(f"invalid host {host!r}: use a host name or an IP address")
    raise _bad(address, why)


def parse_address(address: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """Split an address into ``(host, port)``; raise ``AddressError`` (a ``ValueError``).

    The scheme may be omitted, as the seeds write ``scheduler:8786``; IPv6 hosts go in
    brackets (``tcp://[::1]:8786``). The error names the address and the accepted forms.
    """
    if not isinstance(address, str):
        raise AddressError(f"an address must be text, not {type(address).__name__}")
    text = address.strip()
    if not text:
        raise _bad(address, "it is empty")
    scheme, sep, rest = text.partition("://")
    if not sep:
        rest = text
    elif scheme not in ("tcp", "tls"):
        raise _bad(address, f"the scheme {scheme + '://'!r} is not supported")
    if rest.startswith("["):
        host, closed, tail = rest[1:].partition("]")
        if not closed or (tail and not tail.startswith(":")):
            raise _bad(address, "unexpected text around the bracketed IPv6 host")
        if ":" not in host:
            raise _bad(address, f"{host!r} in brackets is not an IPv6 address")
        port_text = tail[1:]
        has_port = bool(tail)
    else:
        if rest.count(":") > 1:
            raise _bad(address, "an IPv6 host goes in brackets, as [::1]:8786")
        host, colon, port_text = rest.partition(":")
        has_port = bool(colon)
    check_host(host, address)
    if not has_port:
        return host, default_port
    if not port_text.isdigit() or not port_text.isascii():
        raise _bad(address, f"the port {port_text!r} is not a number")
    port = int(port_text)
    if not 0 <= port < 65536:
        raise _bad(address, f"the port {port} is not in 0-65535")
    return host, port


def format_address(host: str, port: int, scheme: str = "tcp") -> str:
    """``tcp://host:port`` (or another ``scheme``), bracketing IPv6 hosts."""
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


#: The scheme of TLS addresses.
TLS = "tls://"


def is_tls(address: str) -> bool:
    """Whether ``address`` (or a listener's host) names TLS: ``tls://...``."""
    return address.startswith(TLS)


def host_part(host: str) -> str:
    """A listener's host without a ``tls://`` or ``tcp://`` in front of it."""
    return host.split("://", 1)[1] if "://" in host and not is_inproc(host) else host


def is_inproc(address: str) -> bool:
    """Whether ``address`` names a listener in this process (``inproc://name``)."""
    return address.startswith(INPROC)


def check_address(address: str) -> None:
    """Raise ``AddressError`` unless ``address`` is a TCP address or ``inproc://name``."""
    if isinstance(address, str) and is_inproc(address):
        name = address[len(INPROC) :]
        if not _HOST.match(name):
            raise AddressError(f"invalid address {address!r}: use inproc://name")
        return
    parse_address(address)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback interface (only local processes reach it)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class RemoteScheduler:
    """The scheduler as a peer names it: ``client.scheduler`` and a worker's
    ``scheduler``, read by Dask scripts as ``.scheduler.address``.

    Dask's is a handle for calling the scheduler's internal handlers
    (``await client.scheduler.nbytes()``); apportion's scheduler takes only its
    protocol's messages, so this holds the address alone, and any other attribute
    is an ``AttributeError`` saying where to look instead.
    """

    __slots__ = ("address",)

    def __init__(self, address: str) -> None:
        #: The scheduler's address, as this peer connects to it.
        self.address = address

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"the scheduler handle has only .address; Dask's scheduler handlers ({name}) "
            "are not served: use the Client's methods of the same names "
            "(client.nbytes(), client.who_has(), ...)"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemoteScheduler) and other.address == self.address

    def __hash__(self) -> int:
        return hash(self.address)

    def __repr__(self) -> str:
        return f"<Scheduler {self.address!r}>"

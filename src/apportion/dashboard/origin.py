"""Where the dashboard listens, the URL it announces, and the ``Host`` headers it
answers. Pure.

``dashboard_address`` takes Dask's forms: ``"host:port"``, ``":port"`` and
``"port"``. A missing host means *the scheduler's*: the dashboard is then never
more exposed than the scheduler itself, which listens on loopback unless told
otherwise (a scheduler in memory gives loopback). A dashboard on a non-loopback
host serves HTTPS with the scheduler's certificate when the scheduler has one;
without one it needs the scheduler's ``allow_plaintext``, else ``check_exposure``
refuses to start, as the scheduler's own check does.

The ``Host`` check defends against DNS rebinding: a web page the user visits
could point a name it controls at 127.0.0.1 and have the browser read the
dashboard as its own origin. The browser then sends that name as ``Host``, so only
names the dashboard is known by are answered: the loopback names, the host it
is bound to and the one its URL names (for a wildcard bind, also this machine's
names and any IP literal, which no rebinding can produce).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from apportion.net.address import (
    AddressError,
    host_part,
    is_inproc,
    is_loopback,
    parse_address,
)
from apportion.net.security import PlaintextRefused

#: Where Dask's dashboard listens, and ours when only ``":port"`` is given.
DEFAULT_DASHBOARD_PORT = 8787
LOOPBACK = "127.0.0.1"
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def bind_address(given: str, scheduler_host: str) -> tuple[str, int]:
    """(host, port) to listen on for ``given``; ``scheduler_host`` fills a missing host."""
    text = given.strip()
    host_given, sep, port_text = text.rpartition(":")
    if text.isdigit():
        host_given, sep, port_text = "", ":", text
    if sep and not host_given:
        if not port_text.isdigit() or not 0 <= int(port_text) < 65536:
            raise AddressError(f"invalid dashboard address {given!r}: use host:port, :port or port")
        return default_host(scheduler_host), int(port_text)
    return parse_address(text, DEFAULT_DASHBOARD_PORT)


def default_host(scheduler_host: str) -> str:
    """The scheduler's host, without its scheme; loopback for one in memory."""
    if is_inproc(scheduler_host):
        return LOOPBACK
    return host_part(scheduler_host).strip("[]") or LOOPBACK


def check_exposure(host: str, *, tls: bool, allow_plaintext: bool) -> None:
    """Refuse a dashboard on a non-loopback ``host`` with neither TLS nor
    ``allow_plaintext`` (see the module)."""
    if tls or allow_plaintext or is_loopback(host):
        return
    raise PlaintextRefused(
        f"refusing to serve the dashboard on {host} without TLS: give the scheduler a "
        "certificate (--tls-cert and --tls-key; the dashboard then serves HTTPS with it), "
        "allow plaintext (--allow-plaintext, allow_plaintext=True), or serve the dashboard "
        "on loopback (--dashboard-address 127.0.0.1:8787) and reach it through an SSH tunnel"
    )


def uses_tls(host: str, has_certificate: bool) -> bool:
    """Whether a dashboard bound to ``host`` serves HTTPS: on non-loopback hosts when the
    scheduler has a certificate. Loopback stays HTTP, which browsers open without a
    certificate warning, and which never leaves the machine."""
    return has_certificate and not is_loopback(host)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where the dashboard is served, once listening."""

    #: The host bound ("0.0.0.0" for every interface).
    host: str
    port: int
    tls: bool
    #: The host the URL names: the bound host, or this machine's name for a wildcard.
    public_host: str

    @property
    def url(self) -> str:
        """``http://host:port`` (or https), no path: the dashboard's base URL."""
        scheme = "https" if self.tls else "http"
        host = f"[{self.public_host}]" if ":" in self.public_host else self.public_host
        return f"{scheme}://{host}:{self.port}"

    @property
    def wildcard(self) -> bool:
        return self.host in WILDCARDS

    def host_allowed(self, header: str, machine_names: frozenset[str] = frozenset()) -> bool:
        """Whether a request's ``Host`` header names this dashboard (see the module).

        ``machine_names`` are this machine's names, accepted on a wildcard bind."""
        parsed = _split_host(header)
        if parsed is None:
            return False
        name, port = parsed
        if port is None:
            port = 443 if self.tls else 80
        if port != self.port:
            return False
        known = LOOPBACK_NAMES | {self.host.lower(), self.public_host.lower()}
        if self.wildcard:
            known |= {n.lower() for n in machine_names}
            if _is_ip(name):
                return True
        return name in known


def _split_host(header: str) -> tuple[str, int | None] | None:
    """(name in lower case, port or None) of a ``Host`` header; None if malformed."""
    text = header.strip().lower()
    if text.startswith("["):
        name, closed, rest = text[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, colon, port_text_found = text.partition(":")
        port_text = port_text_found if colon else None
    if not name:
        return None
    if port_text is None:
        return name.rstrip("."), None
    if not port_text.isdigit() or not port_text.isascii() or len(port_text) > 5:
        return None
    return name.rstrip("."), int(port_text)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True

"""Addresses as users write them: ``tcp://host:port``, ``host:port`` or ``host``."""

from __future__ import annotations

DEFAULT_PORT = 8786


def parse_address(address: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """Split an address into ``(host, port)``.

    The scheme may be omitted, as the seeds write ``scheduler:8786``; IPv6 hosts go in
    brackets (``tcp://[::1]:8786``).
    """
    text = address.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        rest = text
    elif scheme != "tcp":
        raise ValueError(f"unsupported address scheme {scheme!r} in {address!r}: use tcp://")
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail and not tail.startswith(":"):
            raise ValueError(f"address {address!r} has unexpected text after ']'")
        port_text = tail[1:]
    else:
        host, _, port_text = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not host:
        raise ValueError(f"address {address!r} has no host")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 <= int(port_text) < 65536:
        raise ValueError(f"address {address!r} has an invalid port {port_text!r}")
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    """``tcp://host:port``, bracketing IPv6 hosts."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"

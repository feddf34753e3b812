"""What answered when a peer is not an apportion scheduler: named from its first bytes.

``Client("127.0.0.1:8787")`` reaches apportion's own dashboard, and ``host:22`` an
SSH server: the error says so rather than quoting bytes alone. Pure. The bytes are
looked at for the words of the error and for nothing else: nothing a peer sends
before it has proved the secret is trusted or unpickled.
"""

from __future__ import annotations

#: The ``Server`` header apportion's dashboard sends, by which a client knows it.
DASHBOARD_SERVER = "apportion"

#: Bytes of a foreign answer quoted in an error (an HTTP status line fits).
QUOTED_BYTES = 40


def peer_kind(sample: bytes) -> str | None:
    """``"HTTP"``, ``"SSH"`` or ``"TLS"`` for an answer that starts as theirs; else None."""
    if sample.startswith(b"HTTP/"):
        return "HTTP"
    if sample.startswith(b"SSH-"):
        return "SSH"
    # A TLS record: handshake (22) or alert (21), version 3.x.
    if len(sample) >= 2 and sample[0] in (21, 22) and sample[1] == 3:
        return "TLS"
    return None


def is_dashboard(sample: bytes) -> bool:
    """Whether an HTTP answer names apportion's dashboard as its server."""
    head = sample.split(b"\r\n\r\n", 1)[0]
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() == b"server":
            return value.strip().decode("latin-1").split("/")[0] == DASHBOARD_SERVER
    return False


def foreign_text(
    address: str,
    sample: bytes,
    *,
    closed: bool = False,
    dashboard_of: str | None = None,
) -> str:
    """The one line for ``address``, where a peer answered ``sample`` to our hello.

    ``dashboard_of`` is the scheduler whose dashboard the user's scheduler file places
    at ``address``, if one does: the error then says where to go instead.
    """
    kind = peer_kind(sample)
    quoted = repr(sample[:QUOTED_BYTES])
    if dashboard_of is not None or (kind == "HTTP" and is_dashboard(sample)):
        web = "HTTPS" if kind == "TLS" else "HTTP"
        where = (
            f"the scheduler is at {dashboard_of}"
            if dashboard_of is not None
            else "give the scheduler's address (the dashboard's page shows it)"
        )
        return f"{address} is apportion's dashboard ({web}), not a scheduler; {where}"
    if kind == "TLS":
        return (
            f"{address}: no apportion handshake: a TLS server answered ({quoted}); "
            "a scheduler that uses TLS is reached at tls://host:port"
        )
    if kind is not None:  # HTTP or SSH
        return (
            f"{address}: no apportion handshake: an {kind} server answered ({quoted}), "
            "not a scheduler"
        )
    ending = " and closed the connection" if closed else ""
    return f"{address}: no apportion handshake: the peer sent {quoted}{ending}"

"""How bytes reach a peer: the ``Transport`` protocol and its choice by address.

Services never open sockets themselves: they ask ``transport_for(address)`` to
connect to an address or to listen on one. ``tcp://`` (or no scheme) is TCP, as it
always was; ``tls://`` is TLS with the process's certificates (``net/tls.py``);
``inproc://name`` is a pipe in memory to a listener of this process
(``net/memory.py``), so a whole cluster can run in one process without a socket.
Either way the result is a ``Stream`` (``net/stream.py``), so ``Connection``, the
framing codec and the handshake run unchanged over all three.
"""

from __future__ import annotations

from typing import Protocol

from apportion.net.address import format_address, host_part, is_inproc, is_tls, parse_address
from apportion.net.memory import MEMORY
from apportion.net.security import Security
from apportion.net.stream import (
    Listener,
    OnConnect,
    Stream,
    TcpListener,
    bind_tcp,
    connect_tcp,
)
from apportion.net.tls import connect_tls, listen_tls


class Transport(Protocol):
    """Opens connections to addresses and listens on them."""

    async def connect(self, address: str) -> Stream:
        """Connect to ``address``; ``OSError`` (``ConnectionRefusedError``) if nobody listens."""
        ...

    async def listen(self, host: str, port: int, on_connect: OnConnect) -> Listener:
        """Listen on ``host``/``port`` (0: any free port); the listener knows its address."""
        ...


class TcpTransport:
    """TCP through ``SocketStream``: zero-copy reads and writes on a plain socket."""

    async def connect(self, address: str) -> Stream:
        host, port = parse_address(address)
        return await connect_tcp(host, port)

    async def listen(self, host: str, port: int, on_connect: OnConnect) -> Listener:
        host = host_part(host)
        sock = bind_tcp(host, port)
        return TcpListener(sock, format_address(host, sock.getsockname()[1]), on_connect)


TCP = TcpTransport()


class TlsTransport:
    """TLS with the certificates ``security`` holds for ``role`` (``scheduler``,
    ``worker`` or ``client``)."""

    def __init__(self, security: Security, role: str) -> None:
        self._security = security
        self._role = role

    async def connect(self, address: str) -> Stream:
        host, port = parse_address(address)
        return await connect_tls(host, port, self._security.connect_context(self._role))

    async def listen(self, host: str, port: int, on_connect: OnConnect) -> Listener:
        context = self._security.listen_context(self._role)
        return await listen_tls(host_part(host), port, on_connect, context)


#: The certificate each role of the handshake shows: its own process's.
CERTIFICATE_OF = {"client": "client", "scheduler": "scheduler"}


def transport_for(
    address: str, security: Security | None = None, role: str = "client"
) -> Transport:
    """The transport to reach ``address`` as ``role``: in memory for ``inproc://``, TLS
    with ``security``'s certificates for ``tls://``, else TCP (``ValueError`` if
    ``security`` requires encryption)."""
    if is_inproc(address):
        return MEMORY
    if is_tls(address):
        if security is None:
            raise ValueError(f"connecting to {address} needs TLS settings (a Security)")
        return TlsTransport(security, CERTIFICATE_OF.get(role, "worker"))
    if security is not None and security.require_encryption:
        raise ValueError(f"{address} is not a tls:// address, and encryption is required here")
    return TCP


def listener_for(host: str, security: Security | None = None, role: str = "scheduler") -> Transport:
    """The transport to listen on ``host`` as ``role``: in memory for ``inproc://``; TLS
    for ``tls://host`` or when ``security`` holds a certificate for ``role``; else TCP
    (``ValueError`` if ``security`` requires encryption)."""
    if is_inproc(host):
        return MEMORY
    if security is not None and (is_tls(host) or security.cert_for(role)[0]):
        return TlsTransport(security, role)
    if is_tls(host) or (security is not None and security.require_encryption):
        raise ValueError(f"listening on {host} with TLS needs a certificate and key for the {role}")
    return TCP


def serving_host(peer_address: str, host: str) -> str:
    """Where to listen so that the peers met at ``peer_address`` can reach us.

    A worker whose scheduler is in memory is in that scheduler's process, and so are
    all its peers: its data port goes in memory too, whatever ``host`` says.
    """
    if is_inproc(peer_address) and not is_inproc(host):
        return "inproc://"
    return host

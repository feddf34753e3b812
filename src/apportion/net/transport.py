"""How bytes reach a peer: the ``Transport`` protocol and its choice by address.

Services never open sockets themselves: they ask ``transport_for(address)`` to
connect to an address or to listen on one. ``tcp://`` (or no scheme) is TCP, as it
always was; ``inproc://name`` is a pipe in memory to a listener of this process
(``net/memory.py``), so a whole cluster can run in one process without a socket.
Either way the result is a ``Stream`` (``net/stream.py``), so ``Connection``, the
framing codec and the handshake run unchanged over both.
"""

from __future__ import annotations

from typing import Protocol

from apportion.net.address import format_address, is_inproc, parse_address
from apportion.net.memory import MEMORY
from apportion.net.stream import OnConnect, Stream, TcpListener, bind_tcp, connect_tcp


class Listener(Protocol):
    """A listening endpoint; ``close`` stops accepting (open connections stay)."""

    #: Where peers connect, with its scheme: ``tcp://host:port``, ``inproc://name``.
    address: str

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


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
        sock = bind_tcp(host, port)
        return TcpListener(sock, format_address(host, sock.getsockname()[1]), on_connect)


TCP = TcpTransport()


def transport_for(address: str) -> Transport:
    """The transport an address's scheme names: in memory for ``inproc://``, else TCP."""
    return MEMORY if is_inproc(address) else TCP


def serving_host(peer_address: str, host: str) -> str:
    """Where to listen so that the peers met at ``peer_address`` can reach us.

    A worker whose scheduler is in memory is in that scheduler's process, and so are
    all its peers: its data port goes in memory too, whatever ``host`` says.
    """
    if is_inproc(peer_address) and not is_inproc(host):
        return "inproc://"
    return host

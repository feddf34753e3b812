"""A peer that speaks apportion's wire format by hand over a plain socket, for the
security tests: unlike ``open_connection`` it can stop anywhere, lie, replay what it
recorded, and send what no real peer would.

Also the payload those tests try to smuggle in: a pickle whose unpickling creates a
file, so that "nothing was unpickled" is a file that does not exist.
"""

from __future__ import annotations

import pickle
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apportion.net import auth
from apportion.protocol.base import PROTOCOL_VERSION, Message
from apportion.protocol.codec import HEADER, MAX_FRAME, decode_frame, encode_frame, frame_sizes
from apportion.protocol.handshake import AuthChallenge, AuthHello, AuthProof, Hello, Refused
from apportion.protocol.peer_data import PutData
from apportion.protocol.tasks import SubmitTasks, TaskSpec

#: Seconds a raw peer waits for the listener to answer or hang up.
ANSWER_TIMEOUT = 5.0


def frame(*messages: Message) -> bytes:
    """One frame carrying ``messages``, as bytes on the wire."""
    return b"".join(bytes(piece) for piece in encode_frame(list(messages)))


def host_port(address: str) -> tuple[str, int]:
    """``("127.0.0.1", 8786)`` from ``tcp://127.0.0.1:8786``."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    return host, int(port)


def connect(address: str) -> socket.socket:
    sock = socket.create_connection(host_port(address), timeout=ANSWER_TIMEOUT)
    sock.settimeout(ANSWER_TIMEOUT)
    return sock


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"the listener hung up after {len(data)} of {n} bytes")
        data += chunk
    return data


def read_frame(sock: socket.socket) -> list[Message]:
    """The messages of the next frame; ``EOFError`` if the listener hung up first."""
    header = _read_exactly(sock, HEADER.size)
    body, count = frame_sizes(header, MAX_FRAME)
    return decode_frame(header + _read_exactly(sock, count * 8 + body))


def hung_up(sock: socket.socket) -> bool:
    """Whether the listener has closed the connection (nothing more arrives), read
    without waiting; what it still had to say is discarded."""
    sock.setblocking(False)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.settimeout(ANSWER_TIMEOUT)


def answers_until_hang_up(sock: socket.socket) -> list[Message]:
    """Every message the listener sends until it hangs up; ``AssertionError`` if it has
    not hung up within ``ANSWER_TIMEOUT``."""
    messages: list[Message] = []
    deadline = time.monotonic() + ANSWER_TIMEOUT
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            messages += read_frame(sock)
        except (EOFError, ConnectionResetError):
            return messages
        except TimeoutError:
            raise AssertionError(f"still connected, after {messages}") from None


@dataclass
class Recording:
    """The frames a connecting side sent in one handshake, to be replayed."""

    hello: bytes
    proof: bytes


def hello_frame(role: str = "client", name: str = "raw-peer", nonce: bytes = b"") -> bytes:
    """The frame a connecting side opens with: ``Hello`` and its ``AuthHello``."""
    return frame(Hello(PROTOCOL_VERSION, role, name), AuthHello(nonce or auth.new_nonce()))


def challenge(sock: socket.socket) -> AuthChallenge:
    """The listener's answer to our hello frame."""
    (answer,) = read_frame(sock)
    assert isinstance(answer, AuthChallenge), answer
    return answer


def prove(
    sock: socket.socket, key: bytes, role: str = "client", name: str = "raw-peer"
) -> tuple[list[Message], Recording]:
    """Shake hands knowing ``key`` (the secret, or a wrong one): the listener's last
    answer (``Welcome`` or ``Refused``) and the frames we sent."""
    ours = auth.new_nonce()
    hello = hello_frame(role, name, ours)
    sock.sendall(hello)
    theirs = challenge(sock)
    proof = frame(AuthProof(auth.proof(key, auth.CONNECTOR, role, name, ours, theirs.nonce)))
    sock.sendall(proof)
    return read_frame(sock), Recording(hello, proof)


def refused(messages: list[Any], reason: str) -> bool:
    """Whether ``messages`` hold a ``Refused`` whose reason starts with ``reason``."""
    return any(isinstance(x, Refused) and x.reason.startswith(reason) for x in messages)


# --- the payload ------------------------------------------------------------------------


class TouchOnUnpickle:
    """Pickles into a call that creates ``path``: a stand-in for any code a pickle runs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return self.path.touch, ()


def touching(path: Path) -> bytes:
    """A pickle that creates ``path`` when loaded (plain pickle: it names no test code)."""
    return pickle.dumps(TouchOnUnpickle(path), protocol=5)


def smuggled(target: str, path: Path) -> bytes:
    """A frame whose handling by ``target`` ("scheduler" or "data port") would unpickle
    ``touching(path)``: a task for the scheduler to send a worker, whose function and
    arguments are that pickle; data to store on a worker's data port."""
    blob = touching(path)
    if target == "scheduler":
        key = f"smuggled-{path.name}"
        task = TaskSpec(key, f"f-{path.name}", blob, [], {}, 0, 0)
        return frame(SubmitTasks([task], {f"f-{path.name}": blob}, [key]))
    return frame(PutData(1, {f"smuggled-{path.name}": blob}))

"""Same-machine transfers: a receiver reads large buffers straight from the sender.

Over loopback TCP every byte is copied twice, into the kernel by the sender and out
of it by the receiver, and both processes spend a core on it. Between two processes
of one machine, Linux's ``process_vm_readv`` copies a buffer once, from the sender's
memory into the receiver's, at memory speed: twice loopback TCP's rate on the
machines we measured (``benchmarks/data_transfer.py``).

How a connection comes to lend:

1. A data port's ``Welcome`` offers its process's *probe* (``offer``): the pid, the
   address of 16 random bytes, and those bytes.
2. A receiver that finds those bytes at that address of that pid (``borrow``) is on
   the same machine, in the same pid namespace, and allowed to read the other
   process (same user; no Yama ``ptrace_scope`` restriction or seccomp filter in the
   way). It answers ``LendBuffers``. A receiver that cannot says nothing, and every
   byte travels over the socket as before.
3. From then on the sender writes the address of each buffer of ``LEND_FROM`` bytes
   or more in place of its bytes, and keeps the buffer alive until the receiver says
   ``BuffersReturned``; the receiver reads it into a buffer of its own before it
   decodes the frame (``Connection.recv``).

``APPORTION_LENDING=0`` in a process's environment turns lending off there: it
neither offers nor asks, as where it cannot.

The probe is a capability check, not a secret. The receiver authenticated its peer in
the handshake before it reads anything, and reading the memory the peer points at
gives it nothing the peer would not have sent anyway.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import struct
import sys
from typing import Any

from apportion.net.stream import Buffer

#: Buffers of this many bytes or more are lent rather than sent: below it, a
#: system call and a reply cost more than the socket's second copy saves.
LEND_FROM = 1 << 20
#: A lent buffer's place in the lender's memory, sent in place of its bytes.
ADDRESS = struct.Struct("!Q")
#: Bytes copied by one system call at most (Linux stops near 2 GiB in one).
READ_CHUNK = 1 << 30


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer``: how any object with the buffer protocol shows its memory."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _bind_read() -> Any:
    """libc's ``process_vm_readv``, or None where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        read = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    iov = ctypes.POINTER(_IoVec)
    read.argtypes = [ctypes.c_int, iov, ctypes.c_ulong, iov, ctypes.c_ulong, ctypes.c_ulong]
    read.restype = ctypes.c_ssize_t
    return read


_READ = _bind_read()
_GET_BUFFER = ctypes.pythonapi.PyObject_GetBuffer
_GET_BUFFER.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_GET_BUFFER.restype = ctypes.c_int
_RELEASE_BUFFER = ctypes.pythonapi.PyBuffer_Release
_RELEASE_BUFFER.argtypes = [ctypes.POINTER(_PyBuffer)]
_RELEASE_BUFFER.restype = None
#: ``PyBUF_SIMPLE``: one contiguous block, as every buffer of a frame is.
_SIMPLE = 0

#: This process's probe: random bytes a reader must find at their address.
_PROBE_TOKEN = secrets.token_bytes(16)
_PROBE = ctypes.create_string_buffer(_PROBE_TOKEN, len(_PROBE_TOKEN))


def address_of(buffer: Buffer) -> int:
    """Where ``buffer``'s bytes start in this process's memory. Valid while ``buffer``
    (which holds its exporter) is alive."""
    view = _PyBuffer()
    _GET_BUFFER(buffer, ctypes.byref(view), _SIMPLE)
    try:
        return int(view.buf or 0)
    finally:
        _RELEASE_BUFFER(ctypes.byref(view))


def read_lent(pid: int, address: int, into: memoryview) -> None:
    """Fill ``into`` (writable bytes) with ``len(into)`` bytes at ``address`` of
    process ``pid``. ``OSError`` if they cannot all be read."""
    if _READ is None:
        raise OSError("reading another process's memory is not supported here")
    local = address_of(into)
    done, total = 0, len(into)
    while done < total:
        n = min(READ_CHUNK, total - done)
        mine, theirs = _IoVec(local + done, n), _IoVec(address + done, n)
        got = _READ(pid, ctypes.byref(mine), 1, ctypes.byref(theirs), 1, 0)
        if got <= 0:
            errno = ctypes.get_errno() if got < 0 else 0
            raise OSError(errno, f"cannot read process {pid}: {os.strerror(errno)}")
        done += got


#: Environment variable that turns lending off in a process when set to ``0``.
SWITCH = "APPORTION_LENDING"


def enabled() -> bool:
    """Whether this process may lend and borrow buffers (Linux, and not switched off)."""
    return _READ is not None and os.environ.get(SWITCH, "1") != "0"


def offer() -> dict[str, Any]:
    """What a data port's ``Welcome`` says so that a receiver can ``borrow``: nothing
    where this process cannot be read from or lending is off."""
    if not enabled():
        return {}
    return {"lender": [os.getpid(), ctypes.addressof(_PROBE), _PROBE_TOKEN]}


def lender_in(info: dict[str, Any]) -> int | None:
    """The pid of the process that sent ``info`` (a ``Welcome``'s), if it offered to
    lend and this process can read it; None otherwise."""
    offered = info.get("lender")
    if not enabled():
        return None
    if not (isinstance(offered, list) and len(offered) == 3):
        return None
    pid, address, token = offered
    if not (isinstance(pid, int) and isinstance(address, int) and isinstance(token, bytes)):
        return None
    found = memoryview(bytearray(len(token)))
    try:
        read_lent(pid, address, found)
    except (OSError, OverflowError):
        return None  # another machine, another pid namespace, or not permitted
    return pid if found == token else None

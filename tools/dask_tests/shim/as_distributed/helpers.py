"""Small utilities Dask's tests import from ``distributed``'s modules and that touch no
cluster (times, platform flags, temporary files, ports): this harness's own versions."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import socket
import sys
import tempfile
import time as _time
from collections.abc import Iterator
from typing import Any
from xml.etree import ElementTree

import cloudpickle
import psutil
from dask.sizeof import sizeof

from apportion import CancelledError, TimeoutError

__all__ = ["CancelledError", "TimeoutError", "sizeof"]

time = _time.time
monotonic = _time.monotonic
LINUX = sys.platform.startswith("linux")
MACOS = sys.platform == "darwin"
WINDOWS = sys.platform.startswith("win")
MEMORY_LIMIT = psutil.virtual_memory().total
dumps = cloudpickle.dumps


def get_mp_context() -> Any:
    return multiprocessing.get_context("spawn")


def open_port(host: str = "") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def tmp_text(filename: str, text: str) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, filename)
        with open(path, "w") as file:
            file.write(text)
        yield path


def is_valid_xml(text: str) -> bool:
    return ElementTree.fromstring(text) is not None


def format_time(seconds: float) -> str:
    if seconds >= 60:
        return f"{seconds / 60:.1f} m"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.2f} us"


def sync(loop: Any, func: Any, *args: Any, callback_timeout: Any = None, **kwargs: Any) -> Any:
    """Dask's ``sync(loop, func)`` runs ``func`` on the event loop of the tests' client
    from a blocking thread. The ``loop`` fixture is None here: the current client's own
    loop stands for it, reached through ``Client.sync``."""
    from apportion import Client

    client = Client.current()
    return client.sync(func, *args, callback_timeout=callback_timeout, **kwargs)


class LateLoopEvent(asyncio.Event):
    """Dask's event that binds to the loop it is first awaited in: what Python's own
    ``asyncio.Event`` has done since 3.10."""


def load_cluster_dump(url: str, **kwargs: Any) -> Any:
    """A file ``client.dump_cluster_state`` wrote, read back as Dask's reader does:
    gzip-compressed msgpack (``.msgpack.gz``) or YAML (``.yaml``), at a path or a
    URL (``file://...``, through fsspec, as Dask's)."""
    import fsspec

    if url.endswith(".msgpack.gz"):
        import msgpack

        with fsspec.open(url, mode="rb", compression="gzip", **kwargs) as file:
            return msgpack.unpack(file, strict_map_key=False)
    if url.endswith(".yaml"):
        import yaml

        with fsspec.open(url, mode="r", **kwargs) as file:
            return yaml.safe_load(file)
    raise ValueError(f"not a cluster dump's name: {url}")

"""Hosts for multi-host tests on one machine: network namespaces, each with its own
10.x address on a bridge of the root namespace (which has an address there too, so
a client here reaches every "host"). Traffic never leaves the machine.

Names carry a random tag, so tests running side by side (or a run that crashed
before cleaning up) do not collide; ``remove`` deletes the namespaces (which takes
their veth ends with them) and the bridge, even after a partial ``create``.
Needs root; ``skip_reason()`` says why not.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import uuid
from collections.abc import Sequence


def skip_reason() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root to make network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    return None


def _ip(*args: str, check: bool = True) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _subnet_in_use(prefix: str) -> bool:
    shown = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    return f" {prefix}." in shown


class Namespaces:
    """``count`` namespaces on one bridge: ``names[i]`` has address ``addresses[i]``."""

    def __init__(self, count: int = 3) -> None:
        tag = uuid.uuid4().hex[:6]
        self.bridge = f"apbr{tag}"  # interface names: 15 characters at most
        self.names = [f"ap{tag}{i}" for i in range(count)]
        self._veths = [f"apv{tag}{i}" for i in range(count)]
        while True:
            self.prefix = f"10.{random.randint(100, 250)}.{random.randint(0, 255)}"
            if not _subnet_in_use(self.prefix):
                break
        self.addresses = [f"{self.prefix}.{i + 1}" for i in range(count)]
        #: The root namespace's address on the bridge.
        self.root_address = f"{self.prefix}.254"

    def create(self) -> Namespaces:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.root_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for name, veth, address in zip(self.names, self._veths, self.addresses, strict=True):
            _ip("netns", "add", name)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")
        return self

    def remove(self) -> None:
        for name in self.names:
            _ip("netns", "del", name, check=False)
        for veth in self._veths:
            _ip("link", "del", veth, check=False)
        _ip("link", "del", self.bridge, check=False)

    def prefix_of(self, index: int) -> list[str]:
        """The command prefix that runs a command in namespace ``index``."""
        return ["ip", "netns", "exec", self.names[index]]

    def exec_argv(self, index: int, argv: Sequence[str]) -> list[str]:
        return [*self.prefix_of(index), *argv]

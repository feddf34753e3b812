"""Python and package versions of one process, shaped like Dask's ``get_versions``.

Read from installed package metadata, so nothing optional is imported to learn its
version (importing pandas to print a number would cost a second).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import struct
import sys
from typing import Any

#: Packages that must match between client, scheduler and workers: a function
#: pickled by one cloudpickle or framed by one msgpack must load on the other side.
REQUIRED = ("python", "apportion", "msgpack", "cloudpickle")

#: Packages reported when installed.
OPTIONAL = ("dask", "distributed", "numpy", "pandas", "tblib", "psutil", "lz4")


def package_version(name: str) -> str | None:
    """The installed version of ``name``, or None if it is not installed."""
    if name == "python":
        return ".".join(map(str, sys.version_info[:3]))
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, Any]:
    """``{"host": {...}, "packages": {name: version or None}}`` for this process."""
    host = {
        "python": sys.version,
        "python-bits": struct.calcsize("P") * 8,
        "OS": platform.system(),
        "OS-release": platform.release(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "byteorder": sys.byteorder,
        "LC_ALL": os.environ.get("LC_ALL", "None"),
        "LANG": os.environ.get("LANG", "None"),
    }
    packages = {name: package_version(name) for name in (*REQUIRED, *OPTIONAL)}
    return {"host": host, "packages": packages}


def mismatches(everyone: dict[str, dict[str, Any]]) -> list[str]:
    """One line per required package whose version differs between the processes.

    ``everyone`` maps a role ("client", "scheduler", a worker address) to what
    ``versions()`` returned there.
    """
    lines = []
    for name in REQUIRED:
        seen = {who: (v.get("packages") or {}).get(name) for who, v in everyone.items()}
        if len(set(seen.values())) > 1:
            where = ", ".join(f"{who}: {version}" for who, version in seen.items())
            lines.append(f"{name} differs ({where})")
    return lines

"""A dump of the cluster's state written to a file, in Dask's formats and by Dask's
naming: ``<filename>.msgpack.gz`` (gzip-compressed msgpack, the default) or
``<filename>.yaml``, plus apportion's ``<filename>.json``; the suffix is added
unless the name ends with it already. A name with ``://`` is a URL, written
through fsspec (as Dask writes any name), which must then be installed; so must
PyYAML for YAML (Dask's own dependency, not apportion's).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
from typing import Any

import msgpack

#: Each format and the suffix its files are given.
SUFFIXES = {"msgpack": ".msgpack.gz", "yaml": ".yaml", "json": ".json"}


def check_format(format: str) -> None:
    """``ValueError`` naming the formats for an unknown one; ``ImportError`` saying
    what to install for YAML without PyYAML. Called before the dump is asked for."""
    if format not in SUFFIXES:
        raise ValueError(
            f"Unsupported format {format!r}: use 'msgpack' (the default), 'yaml' or 'json'"
        )
    if format == "yaml" and importlib.util.find_spec("yaml") is None:
        raise ImportError(
            "dump_cluster_state(format='yaml') needs PyYAML, which is not installed: "
            "pip install pyyaml (or use format='msgpack')"
        )


def dump_path(filename: str | os.PathLike[str], format: str) -> str:
    """Where a dump named ``filename`` is written in ``format``."""
    name = os.fspath(filename)
    suffix = SUFFIXES[format]
    return name if name.endswith(suffix) else name + suffix


def without(value: Any, exclude: frozenset[str]) -> Any:
    """``value`` with every mapping entry named in ``exclude`` left out, at any depth."""
    if isinstance(value, dict):
        return {k: without(v, exclude) for k, v in value.items() if k not in exclude}
    if isinstance(value, list | tuple):
        return [without(v, exclude) for v in value]
    return value


def encoded(state: Any, format: str) -> bytes:
    """The file's bytes: ``state`` as plain data (text keys, lists, scalars)."""
    plain = _plain(state)
    if format == "msgpack":
        return gzip.compress(msgpack.packb(plain))
    if format == "yaml":
        import yaml  # type: ignore[import-untyped, unused-ignore]

        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        text: str = yaml.dump(plain, Dumper=dumper)
        return text.encode()
    return json.dumps(plain, indent=1).encode()


def write_dump(
    state: Any, filename: str | os.PathLike[str], format: str, storage_options: dict[str, Any]
) -> str:
    """Write ``state`` as a dump named ``filename``; the path (or URL) written."""
    path = dump_path(filename, format)
    data = encoded(state, format)
    if "://" in path:
        if importlib.util.find_spec("fsspec") is None:
            raise ImportError(
                f"writing a dump to the URL {path!r} needs fsspec: pip install fsspec"
            )
        import fsspec  # type: ignore[import-untyped, unused-ignore]

        with fsspec.open(path, "wb", **storage_options) as f:
            f.write(data)
        return path
    if storage_options:
        raise TypeError(
            f"storage options ({', '.join(sorted(storage_options))}) apply to URLs only; "
            f"{path!r} is a local path"
        )
    with open(path, "wb") as f:
        f.write(data)
    return path


def _plain(value: Any) -> Any:
    """What every format writes alike: text keys, lists, and ``str`` of anything else."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return str(value)

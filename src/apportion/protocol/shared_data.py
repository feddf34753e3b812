"""Client <-> scheduler: data shared between clients, and copies of results.

Published datasets and metadata live in the scheduler (``scheduler/shared_data.py``);
replicate and rebalance move copies of results between workers
(``scheduler/copies.py``).
"""

from __future__ import annotations

from typing import Any

from apportion.core.payload import Pickled
from apportion.protocol.base import Message, message


@message(77)
class PublishDataset(Message):
    """Client -> scheduler: keep ``data`` under ``name``, and the keys it refers to."""

    request_id: int
    name: str
    data: Pickled  #: the pickled object; futures inside it pickle as references to ``keys``
    keys: list[str]
    override: int  #: 1: replace a dataset of that name; 0: refuse (as Dask's KeyError)


@message(78)
class UnpublishDataset(Message):
    """Client -> scheduler: forget these datasets and let their keys go."""

    request_id: int
    names: list[str]


@message(79)
class DatasetRequest(Message):
    """Client -> scheduler: the dataset ``name``; also the names of all (for the error)."""

    request_id: int
    name: str


@message(80)
class DatasetReply(Message):
    """The dataset asked for (``found`` 0: unknown), and every published name."""

    request_id: int
    found: int
    data: Pickled
    keys: list[str]
    names: list[str]


@message(81)
class SharedDataAck(Message):
    """Scheduler -> client: done; ``error`` says why not (empty when it was done)."""

    request_id: int
    error: str


@message(82)
class SetMetadata(Message):
    """Client -> scheduler: store a plain value at a path of nested dictionaries."""

    request_id: int
    path: list[str]
    value: Any


@message(83)
class MetadataRequest(Message):
    """Client -> scheduler: the value at ``path``."""

    request_id: int
    path: list[str]


@message(84)
class MetadataReply(Message):
    request_id: int
    found: int
    value: Any


@message(88)
class ReplicateKeys(Message):
    """Client -> scheduler: have ``n`` workers (0: all) of ``workers`` (empty: all) hold
    each key; answered with ``CopiesDone`` once every copy is stored."""

    request_id: int
    keys: list[str]
    n: int
    workers: list[str]  #: worker addresses or names


@message(89)
class RebalanceKeys(Message):
    """Client -> scheduler: even out the bytes each worker holds by moving results."""

    request_id: int
    keys: list[str]
    all_keys: int  #: 1: every result in memory (``keys`` is then ignored)
    workers: list[str]  #: worker addresses or names; empty: all


@message(90)
class CopiesDone(Message):
    """Scheduler -> client: a replicate or rebalance finished."""

    request_id: int
    copied: int  #: copies stored (for a rebalance: results moved)
    dropped: int  #: copies let go (replicas over ``n``; sources of moves)

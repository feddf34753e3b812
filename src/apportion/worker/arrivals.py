"""Values arriving at this worker, unpickled into its data store as they come.

A put (by a client on the data port, or relayed by the scheduler) and each part of
a peer's answer to a fetch. The state machine then hears of them as one event with
each value's size and type, never the value. A value that cannot be unpickled is
logged and not stored: a put leaves it out, a fetch reports it missing, so that the
task that needed it is told which input was lost.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from apportion.core.payload import loads
from apportion.core.type_names import type_name
from apportion.protocol.peer_data import DataReply, PutData
from apportion.worker.events import DataInfo, DataPut, FetchDone
from apportion.worker.sizeof import sizeof

logger = logging.getLogger("apportion.worker")


def store_put(data: MutableMapping[str, Any], message: PutData, now: float, name: str) -> DataPut:
    """The values of a put, unpickled into ``data``."""
    stored: dict[str, DataInfo] = {}
    for key, blob in message.data.items():
        try:
            value = loads(blob)
        except Exception:
            logger.exception("worker %s: cannot unpickle put data %r; not stored", name, key)
            continue
        data[key] = value
        stored[key] = DataInfo(sizeof(value), type_name(value))
    return DataPut(message.request_id, stored, now)


def store_fetched(
    data: MutableMapping[str, Any], address: str, part: DataReply, now: float, name: str
) -> FetchDone:
    """The values of one part of a peer's answer, unpickled into ``data``."""
    obtained: dict[str, DataInfo] = {}
    missing = list(part.missing)
    for key, blob in part.data.items():
        try:
            value = loads(blob)
        except Exception:
            logger.exception("worker %s: cannot unpickle %r from %s", name, key, address)
            missing.append(key)
            continue
        data[key] = value
        obtained[key] = DataInfo(sizeof(value), type_name(value))
    return FetchDone(address, obtained, tuple(missing), now, dict(part.errors))

"""Values arriving at this worker, stored still pickled in its data store.

A put (by a client on the data port, or relayed by the scheduler) and each part of
a peer's answer to a fetch. They arrive on the event loop, which never unpickles
them: each is stored as a ``StillPickled`` and unpickled by the thread that first
needs it (``still_pickled`` says why). The state machine then hears of them as one
event with each value's size (its bytes' length) and no type name (the bytes do
not say it without unpickling; "" is "unknown" to the scheduler), never the value.
A value that cannot be unpickled fails the task that takes it as an input, with
the unpickling error, on the thread that tried.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from apportion.protocol.peer_data import DataReply, PutData
from apportion.worker.events import DataInfo, DataPut, FetchDone
from apportion.worker.still_pickled import StillPickled


def store_put(data: MutableMapping[str, Any], message: PutData, now: float) -> DataPut:
    """The values of a put, stored still pickled in ``data``."""
    stored: dict[str, DataInfo] = {}
    for key, blob in message.data.items():
        value = data[key] = StillPickled(blob)
        stored[key] = DataInfo(value.nbytes, "")
    return DataPut(message.request_id, stored, now)


def store_fetched(
    data: MutableMapping[str, Any], address: str, part: DataReply, now: float
) -> FetchDone:
    """The values of one part of a peer's answer, stored still pickled in ``data``."""
    obtained: dict[str, DataInfo] = {}
    for key, blob in part.data.items():
        value = data[key] = StillPickled(blob)
        obtained[key] = DataInfo(value.nbytes, "")
    return FetchDone(address, obtained, tuple(part.missing), now, dict(part.errors))

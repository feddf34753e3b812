"""Client <-> scheduler: questions about the cluster, and its restart.

Each request carries a ``request_id`` its reply repeats: why keys wait, who is there
(info, facts, status, the waiting work), a task's story, versions, logs, a dump of
the whole state; whether demands could ever be met; and a restart of every worker.
"""

from __future__ import annotations

from typing import Any

from apportion.protocol.base import Message, message


@message(15)
class WhyRequest(Message):
    """Explain why each key is not running."""

    request_id: int
    keys: list[str]


@message(16)
class InfoRequest(Message):
    """The cluster's identity, workers and their pools."""

    request_id: int


@message(17)
class StoryRequest(Message):
    """The transitions of one task with their causes."""

    request_id: int
    key: str


@message(24)
class WhyReply(Message):
    request_id: int
    reasons: dict[str, str]


@message(25)
class InfoReply(Message):
    request_id: int
    info: dict[str, Any]


@message(26)
class StoryReply(Message):
    request_id: int
    story: list[list[Any]]  #: [time, key, from_state, to_state, cause]


@message(53)
class DumpRequest(Message):
    """Ask for the whole cluster state as plain data, for a bug report."""

    request_id: int


@message(54)
class DumpReply(Message):
    request_id: int
    state: dict[str, Any]


@message(60)
class CheckDemands(Message):
    """Client -> scheduler: could the connected workers ever hold each of these
    demands (``{pool: ticks}``)? The job queue asks before it queues runs."""

    request_id: int
    demands: list[dict[str, int]]


@message(61)
class DemandsChecked(Message):
    """One ``[kind, text]`` per demand asked, in order (``CheckDemands``)."""

    request_id: int
    verdicts: list[list[str]]


@message(73)
class VersionsRequest(Message):
    """Client -> scheduler: the scheduler's Python and package versions."""

    request_id: int


@message(74)
class VersionsReply(Message):
    request_id: int
    versions: dict[str, Any]


@message(75)
class LogsRequest(Message):
    """Client -> scheduler: the scheduler's most recent log records (``n`` <= 0: all kept)."""

    request_id: int
    n: int


@message(76)
class LogsReply(Message):
    request_id: int
    records: list[list[str]]  #: [level name, formatted message], oldest first


@message(85)
class ClusterFactsRequest(Message):
    """Client -> scheduler: who holds what, threads and running tasks of every worker."""

    request_id: int


@message(86)
class ClusterFactsReply(Message):
    """Shaped as Dask's answers: keys -> holder addresses, and per worker address."""

    request_id: int
    who_has: dict[str, list[str]]
    has_what: dict[str, list[str]]
    nthreads: dict[str, int]
    processing: dict[str, list[str]]


@message(91)
class RestartRequest(Message):
    """Client -> scheduler: drop every task and result, and reset every worker.

    Every client's futures are told (``KeysPending`` then ``KeysFailed`` "cancelled",
    so finished ones are cancelled too). Supervised workers are told to exit
    (``RestartWorker``) for a fresh process; the others are disconnected, which makes
    them forget their tasks and data and register afresh.
    """

    request_id: int
    reason: str


@message(92)
class RestartReply(Message):
    """How many workers were reset, and the names of those no supervisor watches."""

    request_id: int
    workers: int
    unsupervised: list[str]


@message(120)
class BacklogRequest(Message):
    """Client -> scheduler: the work waiting for room, by kind of request, and the
    workers (what a cluster that grows and shrinks decides from)."""

    request_id: int


@message(121)
class BacklogReply(Message):
    """``queued``: per kind of request, ``options`` (the alternatives of its demand,
    each ``{pool: ticks}``), ``count`` and ``restricted``; ``workers``: ``name``,
    ``address``, ``running``, ``leaving`` (``scheduler.backlog``)."""

    request_id: int
    queued: list[dict[str, Any]]
    workers: list[dict[str, Any]]


@message(122)
class StatusRequest(Message):
    """Client -> scheduler: the cluster's status (``scheduler/status.py``), with the
    task stream's executions and the warnings that came after the given numbers."""

    request_id: int
    stream_since: int
    events_since: int
    stream_limit: int


@message(123)
class StatusReply(Message):
    request_id: int
    status: dict[str, Any]


@message(126)
class NbytesRequest(Message):
    """Client -> scheduler: the size of each result held in memory: of ``keys``, or,
    with ``every`` 1, of every key."""

    request_id: int
    keys: list[str]
    every: int


@message(127)
class NbytesReply(Message):
    """Key -> bytes of its result, for the keys asked of that have one in memory."""

    request_id: int
    nbytes: dict[str, int]

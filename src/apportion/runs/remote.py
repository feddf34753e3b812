"""Talking to a scheduler's job queue over TCP: submit runs, follow them, cancel them.

Used by ``apportion submit``: the scheduler may be on another machine, with its
journal and the runs' logs there, so everything goes through the connection.
Each call is one request and one answer on a short-lived client connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from apportion.net.connection import ConnectionClosed
from apportion.net.handshake import HandshakeError, open_connection
from apportion.net.security import AuthenticationError, security_for
from apportion.protocol.base import Message
from apportion.protocol.codec import ProtocolError
from apportion.protocol.services import Unserved
from apportion.runs.journal import RunRecord
from apportion.runs.messages import CancelRuns, QueryRuns, RunsReport, RunsSubmitted, SubmitRuns
from apportion.runs.spec import RunSpec

#: A query for every run answers with the most recent ones, at most this many.
MAX_LISTED = 1_000

_ids = itertools.count(1)


class RemoteQueueError(Exception):
    """The scheduler could not be reached, or refused the request (says why)."""


async def _ask(address: str, request: Message, timeout: float) -> Message:
    try:
        conn, _ = await asyncio.wait_for(
            open_connection(address, "client", "runs", security=security_for(address)), timeout
        )
    except (OSError, HandshakeError, AuthenticationError) as exc:  # TimeoutError: OSError
        raise RemoteQueueError(f"cannot reach the scheduler at {address}: {exc}") from None
    try:
        conn.send(request)
        while True:
            for reply in await asyncio.wait_for(conn.recv(), timeout):
                if isinstance(reply, RunsSubmitted | RunsReport):
                    return reply
                if isinstance(reply, Unserved):
                    return _without_journal(request)
    except (OSError, ConnectionClosed, ProtocolError) as exc:
        raise RemoteQueueError(f"the scheduler at {address} went away: {exc}") from None
    finally:
        conn.abort()


def _without_journal(request: Message) -> Message:
    """The answer of a scheduler that serves no run journal."""
    if isinstance(request, SubmitRuns):
        text = "this scheduler keeps no run journal (start it with --journal)"
        return RunsSubmitted(request.request_id, [], text)
    assert isinstance(request, QueryRuns | CancelRuns)
    return RunsReport(request.request_id, [])


@dataclasses.dataclass(frozen=True, slots=True)
class Submitted:
    """What the scheduler answered to a submission."""

    #: The ids given to the runs, in the order of the specs.
    ids: list[int]
    #: Per run, what the connected workers make of its request: ``(kind, text)``,
    #: kind "" when one of them could run it, "no workers" when none is connected,
    #: "unsatisfiable" when none could (``scheduler.unsatisfiable.check_demand``).
    verdicts: list[tuple[str, str]]


def submit(address: str, specs: Sequence[RunSpec], timeout: float = 30.0) -> Submitted:
    """Queue ``specs`` on the scheduler at ``address``; raises ``RemoteQueueError`` if it
    refused them (a resource name misspelt, say: nothing is queued then)."""
    request = SubmitRuns(next(_ids), [spec.to_dict() for spec in specs])
    reply = asyncio.run(_ask(address, request, timeout))
    assert isinstance(reply, RunsSubmitted)
    if reply.error:
        raise RemoteQueueError(reply.error)
    try:
        verdicts = [(str(kind), str(text)) for kind, text in reply.verdicts]
    except ValueError:
        raise RemoteQueueError("the scheduler sent a malformed answer") from None
    return Submitted(list(reply.ids), verdicts or [("", "")] * len(reply.ids))


def query(address: str, ids: Sequence[int], timeout: float = 30.0) -> list[RunRecord]:
    """Runs ``ids`` as the scheduler's journal has them (no ids: the latest ones)."""
    reply = asyncio.run(_ask(address, QueryRuns(next(_ids), list(ids)), timeout))
    assert isinstance(reply, RunsReport)
    return [record_from_dict(row) for row in reply.runs]


def cancel(address: str, ids: Sequence[int], timeout: float = 30.0) -> list[RunRecord]:
    """Ask the scheduler to cancel runs ``ids``; the runs afterwards (unknown ids left out)."""
    reply = asyncio.run(_ask(address, CancelRuns(next(_ids), list(ids)), timeout))
    assert isinstance(reply, RunsReport)
    return [record_from_dict(row) for row in reply.runs]


def record_to_dict(record: RunRecord) -> dict[str, Any]:
    """A run record as plain data for the wire; its environment stays with the scheduler."""
    # Shallow: the other fields are plain values; asdict would deep-copy the spec's
    # environment only for it to be replaced.
    data = {field.name: getattr(record, field.name) for field in dataclasses.fields(record)}
    data["spec"] = dataclasses.replace(record.spec, env={}).to_dict()
    return data


def record_from_dict(data: dict[str, Any]) -> RunRecord:
    """The inverse of ``record_to_dict``; raises ``RemoteQueueError`` on a bad answer."""
    try:
        fields = dict(data)
        fields["spec"] = RunSpec.from_dict(fields["spec"])
        return RunRecord(**fields)
    except (KeyError, TypeError, ValueError) as exc:
        raise RemoteQueueError(f"the scheduler sent a malformed run: {exc}") from None

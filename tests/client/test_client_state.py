"""The client's pure state: scheduler messages in, outcomes out, no cluster.

A Hypothesis state machine drives references, cancels, scheduler messages and the
loss of the scheduler in any order, and checks that a key is released to the
scheduler exactly once when its last future goes, never while one is alive, and
never after the client closed.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from apportion.client.future import KeyState
from apportion.client.state import (
    CANCELLED,
    ERROR,
    FINISHED,
    LOST,
    PENDING,
    ClientState,
    Deliver,
    KeyRecord,
    NoticeText,
    PendingRequests,
    Release,
    Reset,
    Settled,
    Unexpected,
    check_invariants,
)
from apportion.protocol.coordination import TopicMessage
from apportion.protocol.peer_data import DataReply
from apportion.protocol.tasks import (
    KeysDone,
    KeysFailed,
    KeysPending,
    Notice,
    SubmitTasks,
    TaskErred,
    WhoHasReply,
)


@pytest.fixture
def state() -> ClientState:
    return ClientState()


def test_a_key_settles_once_with_what_the_scheduler_said(state: ClientState) -> None:
    state.ref("x")
    state.ref("y")
    assert state.handle(KeysDone(["x", "unknown"])) == [Settled("x", FINISHED, None)]
    assert state.handle(KeysDone(["x"])) == []  # settled already
    erred = state.handle(TaskErred("y", b"exc", b"tb", 3))
    assert erred == [Settled("y", ERROR, ("exception", b"exc", b"tb"))]
    assert state.keys["y"].attempts == 3
    check_invariants(state)


def test_failures_say_their_kind(state: ClientState) -> None:
    state.ref("a")
    state.ref("b")
    assert state.handle(KeysFailed(["a"], "unsatisfiable", "no GPU")) == [
        Settled("a", ERROR, ("unsatisfiable", "no GPU", b""))
    ]
    assert state.handle(KeysFailed(["b"], "cancelled", "restarted")) == [
        Settled("b", CANCELLED, ("cancelled", "restarted", b""))
    ]


def test_the_last_future_gone_releases_the_key_once(state: ClientState) -> None:
    state.ref("x")
    state.ref("x")
    assert state.keys["x"].refs == 2
    assert state.unref("x") is None
    assert state.unref("x") == Release("x")
    assert "x" not in state.keys
    assert state.unref("x") is None  # nothing left to release


def test_a_closed_client_releases_nothing(state: ClientState) -> None:
    state.ref("x")
    state.close()
    assert state.unref("x") is None
    assert state.keys == {}


def test_results_lost_or_retried_are_pending_again(state: ClientState) -> None:
    for key in "abc":
        state.ref(key)
    state.handle(KeysDone(["a"]))
    state.handle(KeysFailed(["b"], "crashed", "worker died"))
    # "c" is still pending: nothing to reset.
    assert state.handle(KeysPending(["a", "b", "c"])) == [Reset("a"), Reset("b")]
    assert state.keys["a"].status == PENDING
    assert state.keys["b"].error is None
    check_invariants(state)


def test_the_echo_of_a_cancel_does_not_cancel_a_resubmission(state: ClientState) -> None:
    state.ref("x")
    assert state.cancel(["x"]) == [Settled("x", CANCELLED, ("cancelled", "'x' was cancelled", b""))]
    assert state.resubmitted("x") == Reset("x")
    assert state.handle(KeysFailed(["x"], "cancelled", "cancelled")) == []  # the echo
    assert state.keys["x"].status == PENDING
    assert state.handle(KeysDone(["x"])) == [Settled("x", FINISHED, None)]


def test_a_second_cancel_from_the_scheduler_is_heard(state: ClientState) -> None:
    state.ref("x")
    state.cancel(["x"])
    state.resubmitted("x")
    state.handle(KeysFailed(["x"], "cancelled", "echo"))
    settled = state.handle(KeysFailed(["x"], "cancelled", "restarted"))
    assert settled == [Settled("x", CANCELLED, ("cancelled", "restarted", b""))]


def test_cancel_leaves_a_finished_result_alone(state: ClientState) -> None:
    state.ref("x")
    state.handle(KeysDone(["x"]))
    assert state.cancel(["x", "unknown"]) == []
    assert state.keys["x"].status == FINISHED
    assert not state.keys["x"].cancel_echo


def test_only_a_failed_key_is_retried_and_only_a_cancelled_one_resubmitted(
    state: ClientState,
) -> None:
    state.ref("x")
    assert state.retried("x") is None
    assert state.resubmitted("x") is None
    state.handle(TaskErred("x", b"e", b"", 1))
    assert state.resubmitted("x") is None
    assert state.retried("x") == Reset("x")
    assert state.retried("unknown") is None


def test_losing_the_scheduler_settles_every_pending_key(state: ClientState) -> None:
    for key in "abc":
        state.ref(key)
    state.handle(KeysDone(["a"]))
    assert state.scheduler_lost("connection reset") == [
        Settled("b", LOST, ("gone", "connection reset", b"")),
        Settled("c", LOST, ("gone", "connection reset", b"")),
    ]
    assert state.scheduler_lost("again") == []
    assert state.keys["a"].status == FINISHED
    check_invariants(state)


def test_notices_topics_and_strangers_come_out_as_they_are(state: ClientState) -> None:
    topic = TopicMessage("news", b"data")
    assert state.handle(topic) == [Deliver(topic)]
    assert state.handle(Notice("warning", "no worker has GPU")) == [NoticeText("no worker has GPU")]
    assert state.handle(SubmitTasks([], {}, [])) == [Unexpected("SubmitTasks")]


KEYS = ("a", "b", "c")


def test_callbacks_are_handed_out_once_with_the_settling(state: ClientState) -> None:
    state.ref("x")
    ran: list[str] = []
    assert state.add_callback("x", lambda: ran.append("a"))
    assert state.add_callback("x", lambda: ran.append("b"))
    (settled,) = state.handle(KeysDone(["x"]))
    assert isinstance(settled, Settled) and len(settled.callbacks) == 2
    for callback in settled.callbacks:
        callback()
    assert ran == ["a", "b"]
    assert not state.add_callback("x", lambda: ran.append("c"))  # settled: the caller runs it
    assert not state.add_callback("unknown", lambda: None)
    state.handle(KeysPending(["x"]))  # computed again: new callbacks wait for it
    assert state.add_callback("x", lambda: ran.append("d"))
    (lost,) = state.scheduler_lost("gone")
    assert [c() for c in lost.callbacks] == [None] and ran[-1] == "d"
    check_invariants(state)


class References(RuleBasedStateMachine):
    """Futures come and go while the scheduler reports and the client cancels."""

    def __init__(self) -> None:
        super().__init__()
        self.state = ClientState()
        self.alive: Counter[str] = Counter()
        self.released: Counter[str] = Counter()
        #: Each key's number of lives: released keys may be referenced again.
        self.lives: Counter[str] = Counter()
        #: Callbacks by number: the key each waits on and in which of its lives, and
        #: how often each ran.
        self.callbacks: dict[int, tuple[str, int]] = {}
        self.ran: Counter[int] = Counter()

    @rule(key=st.sampled_from(KEYS))
    def make_future(self, key: str) -> None:
        if self.alive[key] == 0:
            self.lives[key] += 1
        record = self.state.ref(key)
        self.alive[key] += 1
        assert record.refs == self.alive[key]

    @rule(key=st.sampled_from(KEYS))
    def drop_future(self, key: str) -> None:
        if self.alive[key] == 0:
            assert self.state.unref(key) is None  # a release of nothing
            return
        self.alive[key] -= 1
        release = self.state.unref(key)
        if release is not None:
            assert release == Release(key)
            assert self.alive[key] == 0, "released while a future is alive"
            self.released[key] += 1
        elif self.alive[key] == 0:
            assert self.state.closed, "the last future went without a release"

    def _run(self, outcomes: list[Any]) -> None:
        for outcome in outcomes:
            if isinstance(outcome, Settled):
                for callback in outcome.callbacks:
                    callback()

    @rule(key=st.sampled_from(KEYS))
    def add_callback(self, key: str) -> None:
        number = len(self.callbacks)
        self.callbacks[number] = (key, self.lives[key])
        callback = partial(self.ran.update, [number])
        if not self.state.add_callback(key, callback):
            callback()  # settled already, or not held: the caller runs it

    @rule(
        keys=st.lists(st.sampled_from(KEYS), max_size=3),
        kind=st.sampled_from(["done", "erred", "failed", "cancelled", "pending"]),
    )
    def scheduler_says(self, keys: list[str], kind: str) -> None:
        if kind == "done":
            outcomes = self.state.handle(KeysDone(keys))
        elif kind == "erred":
            outcomes = [o for k in keys for o in self.state.handle(TaskErred(k, b"e", b"", 1))]
        elif kind == "pending":
            outcomes = self.state.handle(KeysPending(keys))
        else:
            outcomes = self.state.handle(KeysFailed(keys, kind, "because"))
        for outcome in outcomes:
            assert not isinstance(outcome, Release), "a message released a key"
        self._run(outcomes)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=3))
    def cancel(self, keys: list[str]) -> None:
        self._run(list(self.state.cancel(keys)))

    @rule(key=st.sampled_from(KEYS))
    def resubmit(self, key: str) -> None:
        self.state.resubmitted(key)

    @rule()
    def lose_the_scheduler(self) -> None:
        lost = self.state.scheduler_lost("gone")
        for settled in lost:
            assert settled.status == LOST
        self._run(list(lost))

    @rule()
    def close(self) -> None:
        self.state.close()

    @invariant()
    def callbacks_run_once_when_their_key_settles(self) -> None:
        assert all(n == 1 for n in self.ran.values()), "a callback ran twice"
        for number, (key, life) in self.callbacks.items():
            record = self.state.keys.get(key)
            if number not in self.ran and record is not None and life == self.lives[key]:
                # Not run: its key is pending (its record keeps it). A callback of an
                # earlier life went with its record, when the key's last future went.
                assert record.status == PENDING, f"callback {number} of settled {key!r}"

    @invariant()
    def references_match(self) -> None:
        check_invariants(self.state)
        assert {k: r.refs for k, r in self.state.keys.items()} == +self.alive
        for key in KEYS:
            # One release per life that ended before the client closed, never more.
            ended = self.lives[key] - (1 if self.alive[key] else 0)
            assert self.released[key] <= ended
            if not self.state.closed:
                assert self.released[key] == ended


TestReferences = References.TestCase
TestReferences.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


# --- pending requests ----------------------------------------------------------------


def test_a_reply_answers_its_pending_request_once() -> None:
    book = PendingRequests()
    first, second = book.next_id(), book.next_id()
    assert first != second
    book.send(first)
    assert book.receive(WhoHasReply(first, {})) == first
    assert book.receive(WhoHasReply(first, {})) == "notice"  # answered already
    assert book.receive(WhoHasReply(second, {})) == "notice"  # never sent
    assert book.receive(Notice("warning", "hello")) == "notice"  # no request id
    assert book.sent == {}


def test_a_closed_peer_fails_only_the_requests_sent_on_it() -> None:
    book = PendingRequests()
    peer, other = object(), object()
    book.send(1, peer)
    book.send(2, other)
    book.send(3)  # to the scheduler
    assert book.peer_lost(peer) == [1]
    assert book.peer_lost(peer) == []
    assert sorted(book.sent) == [2, 3]
    assert book.receive(DataReply(2, {}, [], {}), other) == 2  # a peer's data reply answers


def test_forwarded_parts_are_kept_for_their_reply_and_taken_once() -> None:
    book = PendingRequests()
    book.send(7)
    part = DataReply(7, {"x": b"1"}, [], {})
    assert book.receive(part) == "kept"  # from the scheduler: ahead of its reply
    assert book.sent == {7: None}  # still waiting for the reply itself
    assert book.receive(WhoHasReply(7, {})) == 7
    assert book.take_parts(7) == [part]
    assert book.take_parts(7) == []


def test_parts_of_a_request_given_up_are_dropped() -> None:
    book = PendingRequests()
    book.send(4)
    book.receive(DataReply(4, {"x": b"1"}, [], {}))
    assert book.receive(WhoHasReply(4, {})) == 4
    book.drop_parts(4)  # the caller had given up: nobody will take them
    assert book.parts == {}


def test_a_key_state_makes_its_event_only_for_a_waiter_and_keeps_it_in_step() -> None:
    state = KeyState("k", KeyRecord(), lambda key, callback: True)
    assert not state.done() and state._event is None
    state.wake()
    assert state.done() and state._event is None  # nobody waited: no event made
    assert state.event.wait(0)  # made settled
    state.rearm()
    assert not state.done() and not state.event.is_set()
    event = state.event
    state.wake()
    assert state.event is event and event.is_set()

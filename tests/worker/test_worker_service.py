"""Workers in-process, driven by a minimal fake scheduler: in memory, or over real TCP on
loopback for what only TCP shows (a foreign client on the data port, default addresses)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import operator
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import tblib

import apportion
from apportion.core.allocation import Allocation
from apportion.core.payload import KeyRef, dumps, function_id, loads, pack_call
from apportion.loop_thread import LoopThread
from apportion.net.connection import Connection
from apportion.net.handshake import HandshakeError, open_connection
from apportion.protocol.base import Message
from apportion.protocol.peer_data import DataReply, DataStored, GetData, PutData
from apportion.protocol.worker import (
    ComputeTask,
    CopiesKept,
    FreeKeys,
    Heartbeat,
    LoadFunction,
    RejoinGranted,
    TaskFinished,
    TaskRaised,
    TaskRejoining,
    TaskSeceded,
)
from apportion.worker.data_server import SEND_ALONE_FROM
from apportion.worker.service import Worker
from apportion.worker.sizeof import sizeof
from fake_scheduler import WAIT, FakeScheduler


def run(test: Callable[[FakeScheduler], Awaitable[None]], host: str = "inproc://") -> None:
    async def main() -> None:
        scheduler = await FakeScheduler(host).start()
        try:
            await asyncio.wait_for(test(scheduler), 30)
        finally:
            await scheduler.close()

    asyncio.run(main())


def compute(key: str, func: Callable[..., Any], *args: Any, **extra: Any) -> list[Message]:
    """LoadFunction + ComputeTask for ``func(*args)``; ``who_has``/``resources`` via extra."""
    blob = dumps(func)
    fid = function_id(blob)
    packed, _ = pack_call(args, {})
    task = ComputeTask(
        key,
        fid,
        packed,
        extra.get("who_has", {}),
        extra.get("p", 0),
        Allocation(extra.get("resources", {}), extra.get("units", {}), extra.get("variant", 0)),
    )
    return [LoadFunction(fid, blob), task]


def send(conn: Connection, messages: list[Message]) -> None:
    for message in messages:
        conn.send(message)


async def get(conn: Connection, scheduler: FakeScheduler, *keys: str) -> DataReply:
    conn.send(GetData(99, list(keys)))
    return await scheduler.expect(conn, DataReply)


def add(a: int, b: int) -> int:
    return a + b


def total_length(*values: bytes) -> int:
    return sum(map(len, values))


def fail(message: str) -> None:
    raise ValueError(message)


#: Let a test hold a task running; module-level so the function pickles by reference.
STARTED = threading.Event()
RELEASE = threading.Event()


def wait_for_release() -> int:
    STARTED.set()
    RELEASE.wait(WAIT)
    return 1


def where_am_i() -> tuple[dict[str, Any], str]:
    return apportion.task_resources(), apportion.get_worker().name


def what_i_hold() -> tuple[dict[str, Any], dict[str, str]]:
    return apportion.task_resources(), apportion.task_environment()


def devices_a_child_sees() -> str:
    show = "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'))"
    child = subprocess.run(
        [sys.executable, "-c", show],
        env=apportion.task_environment(),
        capture_output=True,
        text=True,
        check=True,
        timeout=WAIT,
    )
    return child.stdout.strip()


@pytest.mark.timeout(30)
def test_registers_runs_a_task_and_serves_its_result() -> None:
    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=2, resources="GPU=2", name="w1") as worker:
            conn, hello = await scheduler.next_worker()
            assert hello.name == "w1" and hello.address == worker.address
            assert hello.nthreads == 2 and hello.resources == {"GPU": 20_000}
            send(conn, compute("x", add, 2, 3))
            done = await scheduler.expect(conn, TaskFinished)
            assert (done.key, done.type_name) == ("x", "int") and done.duration >= 0
            reply = await get(conn, scheduler, "x", "nope")
            assert loads(reply.data["x"]) == 5 and reply.missing == ["nope"]
            assert worker.data == {"x": 5}

    run(scenario)


@pytest.mark.timeout(30)
def test_raised_exception_keeps_its_type_and_traceback() -> None:
    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=1):
            conn, _ = await scheduler.next_worker()
            send(conn, compute("x", fail, "boom"))
            raised = await scheduler.expect(conn, TaskRaised)
            exc = loads(raised.exception)
            assert isinstance(exc, ValueError) and exc.args == ("boom",)
            tb = tblib.Traceback.from_dict(loads(raised.traceback)).as_traceback()
            names = []
            while tb is not None:
                names.append(tb.tb_frame.f_code.co_name)
                tb = tb.tb_next
            assert names == ["fail"]

    run(scenario)


class RefusesItsSize:
    """As a Dask collection does: ``nbytes`` raises."""

    @property
    def nbytes(self) -> int:
        raise NotImplementedError("nbytes is not implemented on DataFrame")

    def __sizeof__(self) -> int:
        raise RuntimeError("nor this")


def refuses_its_size() -> RefusesItsSize:
    return RefusesItsSize()


def test_a_result_that_refuses_to_be_measured_still_finishes() -> None:
    assert sizeof(RefusesItsSize()) == 0
    assert sizeof([RefusesItsSize()] * 3) > 0

    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=1):
            conn, _ = await scheduler.next_worker()
            send(conn, compute("x", refuses_its_size))
            await scheduler.expect(conn, TaskFinished)
            send(conn, compute("y", operator.add, 1, 2))  # its thread is still there
            await scheduler.expect(conn, TaskFinished)

    run(scenario)


@pytest.mark.timeout(30)
def test_task_sees_its_resources_and_worker() -> None:
    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=1, resources={"GPU": 2}, name="gpu-box"):
            conn, _ = await scheduler.next_worker()
            send(conn, compute("x", where_am_i, resources={"GPU": 5_000}))
            await scheduler.expect(conn, TaskFinished)
            reply = await get(conn, scheduler, "x")
            assert loads(reply.data["x"]) == ({"GPU": 0.5}, "gpu-box")

    run(scenario)
    with pytest.raises(RuntimeError, match="inside a task"):
        apportion.task_resources()


@pytest.mark.timeout(30)
def test_task_sees_the_units_the_scheduler_gave_it() -> None:
    async def scenario(scheduler: FakeScheduler) -> None:
        spec = "gpu=[0-3] MEMORY=7e10"
        async with Worker(scheduler.address, nthreads=1, resources=spec):
            conn, hello = await scheduler.next_worker()
            assert hello.units == {"gpu": ["0", "1", "2", "3"]}
            need = {"gpu": 20_000, "MEMORY": 7 * 10**14}
            send(conn, compute("x", what_i_hold, resources=need, units={"gpu": ["2", "3"]}))
            await scheduler.expect(conn, TaskFinished)
            held, env = loads((await get(conn, scheduler, "x")).data["x"])
            assert held == {"gpu": [2, 3], "MEMORY": 7e10}
            assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
            assert env["APPORTION_RESOURCE_GPU"] == "2,3"
            assert env["APPORTION_RESOURCE_MEMORY"] == "70000000000"

    run(scenario)


@pytest.mark.process
@pytest.mark.timeout(30)
def test_a_process_started_with_task_environment_sees_only_its_gpus() -> None:
    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=1, resources="gpu=[0,1,2,3]"):
            conn, _ = await scheduler.next_worker()
            units = {"gpu": ["1", "3"]}
            send(conn, compute("x", devices_a_child_sees, resources={"gpu": 20_000}, units=units))
            done = await scheduler.expect(conn, TaskFinished)
            assert done.key == "x"
            assert loads((await get(conn, scheduler, "x")).data["x"]) == "1,3"

    run(scenario)


@pytest.mark.timeout(30)
def test_dependency_is_fetched_from_a_peer_and_its_copy_kept_until_freed() -> None:
    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=1) as a, Worker(scheduler.address) as b:
            conn_a, _ = await scheduler.next_worker()
            conn_b, _ = await scheduler.next_worker()
            send(conn_a, compute("x", add, 1, 2))
            await scheduler.expect(conn_a, TaskFinished)
            send(conn_b, compute("y", add, KeyRef("x"), 10, who_has={"x": [a.address]}))
            assert await scheduler.expect(conn_b, CopiesKept) == CopiesKept(["x"])
            done = await scheduler.expect(conn_b, TaskFinished)
            assert done.key == "y"
            assert loads((await get(conn_b, scheduler, "y")).data["y"]) == 13
            assert b.data["x"] == 3 and "x" in a.data
            conn_b.send(FreeKeys(["x"]))
            for _ in range(int(WAIT / 0.01)):  # polling: nothing answers a free
                if "x" not in b.data:
                    break
                await asyncio.sleep(0.01)
            assert "x" not in b.data

    run(scenario)


@pytest.mark.timeout(30)
def test_a_peer_gets_small_values_first_then_each_large_one_alone() -> None:
    big = b"b" * SEND_ALONE_FROM

    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=1) as worker:
            conn, _ = await scheduler.next_worker()
            values = {"big1": big, "s": b"small", "big2": big + b"2", "t": 7}
            conn.send(PutData(1, {key: dumps(value) for key, value in values.items()}))
            await scheduler.expect(conn, DataStored)
            peer, _ = await open_connection(
                worker.address, "peer", "test", security=worker.security
            )
            try:
                asked = ["big1", "s", "gone", "big2", "t"]
                peer.send(GetData(5, asked, in_parts=True))
                parts = [await peer.recv() for _ in range(3)]  # one frame per part
            finally:
                await peer.close()
            replies = [reply for (reply,) in parts if isinstance(reply, DataReply)]
            assert [sorted(r.data) for r in replies] == [["s", "t"], ["big1"], ["big2"]]
            assert [r.missing for r in replies] == [["gone"], [], []]
            assert {r.request_id for r in replies} == {5}
            assert loads(replies[2].data["big2"]) == values["big2"]

    run(scenario)


@pytest.mark.timeout(30)
def test_inputs_fetched_in_parts_from_a_peer_all_arrive() -> None:
    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=1) as a, Worker(scheduler.address) as b:
            conn_a, _ = await scheduler.next_worker()
            conn_b, _ = await scheduler.next_worker()
            data = {"x": b"x" * SEND_ALONE_FROM, "y": b"y" * SEND_ALONE_FROM, "z": b"z"}
            conn_a.send(PutData(1, {key: dumps(value) for key, value in data.items()}))
            await scheduler.expect(conn_a, DataStored)
            who_has = {key: [a.address] for key in data}
            refs = [KeyRef(key) for key in data]
            send(conn_b, compute("n", total_length, *refs, who_has=who_has))
            assert (await scheduler.expect(conn_b, TaskFinished)).key == "n"
            reply = await get(conn_b, scheduler, "n")
            assert loads(reply.data["n"]) == 2 * SEND_ALONE_FROM + 1
            assert {key: b.data[key] for key in data} == data  # every part arrived whole

    run(scenario)


@pytest.mark.timeout(30)
def test_put_data_is_stored_and_acknowledged() -> None:
    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=1) as worker:
            conn, _ = await scheduler.next_worker()
            conn.send(PutData(4, {"s": dumps(b"abc")}))
            stored = await scheduler.expect(conn, DataStored)
            # Kept pickled until a task needs it: its size is its bytes'.
            assert stored == DataStored(4, ["s"], {"s": len(dumps(b"abc"))})
            send(conn, compute("t", add, KeyRef("s"), b"d", who_has={"s": [worker.address]}))
            await scheduler.expect(conn, TaskFinished)
            conn.send(FreeKeys(["s"]))
            assert loads((await get(conn, scheduler, "t", "s")).data["t"]) == b"abcd"
            assert "s" not in worker.data

    run(scenario)


@pytest.mark.timeout(30)
def test_execution_freed_while_running_is_still_reported() -> None:
    STARTED.clear()
    RELEASE.clear()

    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=1) as worker:
            conn, _ = await scheduler.next_worker()
            send(conn, compute("x", wait_for_release))
            assert await asyncio.to_thread(STARTED.wait, WAIT)
            conn.send(FreeKeys(["x"]))
            # The reply proves the worker handled FreeKeys before the task ends.
            assert (await get(conn, scheduler, "x")).missing == ["x"]
            RELEASE.set()
            assert (await scheduler.expect(conn, TaskFinished)).key == "x"
            assert "x" not in (await get(conn, scheduler, "x")).data
            assert "x" not in worker.data

    run(scenario)


@pytest.mark.tcp
@pytest.mark.timeout(30)
def test_garbage_on_the_data_port_closes_only_that_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=1) as worker:
            conn, _ = await scheduler.next_worker()
            host, port = worker.address.removeprefix("tcp://").rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert await asyncio.wait_for(reader.read(), WAIT) == b""  # closed on us
            writer.close()
            with pytest.raises(HandshakeError, match="role 'worker' is not served"):
                await open_connection(
                    worker.address, "worker", "intruder", security=worker.security
                )
            peer, _ = await open_connection(
                worker.address, "peer", "friend", security=worker.security
            )
            peer.send(GetData(1, ["none"]))
            assert (await asyncio.wait_for(peer.recv(), WAIT)) == [DataReply(1, {}, ["none"], {})]
            await peer.close()
            send(conn, compute("x", add, 1, 1))
            assert (await scheduler.expect(conn, TaskFinished)).key == "x"

    with caplog.at_level(logging.WARNING, logger="apportion.worker"):
        run(scenario, host="127.0.0.1")
    # Both refusals come from one host within a minute: one line says so.
    assert caplog.text.count("refused a connection from 127.0.0.1") == 1


@pytest.mark.timeout(30)
def test_without_reconnect_timeout_the_worker_closes_when_the_scheduler_goes_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario(scheduler: FakeScheduler) -> None:
        worker = await Worker(scheduler.address, nthreads=1, reconnect_timeout=0).start()
        conn, _ = await scheduler.next_worker()
        await conn.close()
        await asyncio.wait_for(worker.finished(), WAIT)
        await worker.close()  # idempotent
        assert worker.sessions == 1

    with caplog.at_level(logging.WARNING, logger="apportion.worker"):
        run(scenario)
    assert "the scheduler closed the connection" in caplog.text
    assert "closing this worker" in caplog.text


@pytest.mark.timeout(30)
def test_heartbeats_carry_executing_tasks_and_memory() -> None:
    STARTED.clear()
    RELEASE.clear()

    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=2, heartbeat_interval=0.02):
            conn, _ = await scheduler.next_worker()
            first = await scheduler.expect(conn, Heartbeat)
            assert first.executing == 0 and first.memory > 10_000_000  # this interpreter's RSS
            send(conn, compute("x", wait_for_release))
            assert await asyncio.to_thread(STARTED.wait, WAIT)
            while (await scheduler.expect(conn, Heartbeat)).executing != 1:
                pass  # one sent before the task started may still be queued
            RELEASE.set()
            await scheduler.expect(conn, TaskFinished)
            while (await scheduler.expect(conn, Heartbeat)).executing != 0:
                pass

    run(scenario)


def spin_until_released() -> int:
    """Keep a core busy until the test has seen it in a heartbeat."""
    STARTED.set()
    spins = 0
    while not RELEASE.is_set():
        spins += 1
    return spins


@pytest.mark.timeout(30)
def test_heartbeats_carry_the_process_cpu_use() -> None:
    STARTED.clear()
    RELEASE.clear()

    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=1, heartbeat_interval=0.02):
            conn, _ = await scheduler.next_worker()
            first = await scheduler.expect(conn, Heartbeat)
            assert first.cpu >= 0.0 and (first.received, first.sent) == (0, 0)
            send(conn, compute("x", spin_until_released))
            assert await asyncio.to_thread(STARTED.wait, WAIT)
            try:
                while (await scheduler.expect(conn, Heartbeat)).cpu <= 0.0:
                    pass  # a heartbeat may fall within one tick of the process's CPU clock
            finally:
                RELEASE.set()
            await scheduler.expect(conn, TaskFinished)

    run(scenario)


@pytest.mark.timeout(30)
def test_worker_reconnects_forgets_its_session_and_registers_afresh(
    caplog: pytest.LogCaptureFixture,
) -> None:
    STARTED.clear()
    RELEASE.clear()

    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=1, name="w") as worker:
            conn, first = await scheduler.next_worker()
            send(conn, compute("kept", add, 1, 2))
            await scheduler.expect(conn, TaskFinished)
            send(conn, compute("running", wait_for_release))
            assert await asyncio.to_thread(STARTED.wait, WAIT)
            old_runner = worker._runner
            assert old_runner is not None
            await conn.close()  # as a scheduler does when it declares the worker lost

            conn, again = await scheduler.next_worker()
            assert again == first  # same name, data address, threads and resources
            assert worker.sessions == 2 and worker.data == {}
            assert not worker.state.tasks and not worker.state.executing
            # The task still running from the old session finishes, and is dropped.
            RELEASE.set()
            for thread in old_runner._threads:
                await asyncio.to_thread(thread.join, WAIT)
            send(conn, compute("new", add, 2, 2))
            assert (await scheduler.expect(conn, TaskFinished)).key == "new"
            reply = await get(conn, scheduler, "kept", "running", "new")
            assert loads(reply.data["new"]) == 4
            assert sorted(reply.missing) == ["kept", "running"]
            reports = [m for m in scheduler._inbox[conn] if isinstance(m, TaskFinished)]
            assert reports == []
            assert set(worker.data) == {"new"}

    with caplog.at_level(logging.WARNING, logger="apportion.worker"):
        run(scenario)
    assert "dropping its tasks and data and reconnecting" in caplog.text
    assert "reconnected to" in caplog.text


@pytest.mark.timeout(30)
def test_worker_gives_up_reconnecting_after_its_timeout(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(scheduler: FakeScheduler) -> None:
        worker = await Worker(scheduler.address, nthreads=1, reconnect_timeout=0.5).start()
        conn, _ = await scheduler.next_worker()
        assert scheduler._server is not None
        scheduler._server.close()  # nobody listens any more
        await scheduler._server.wait_closed()
        await conn.close()
        await asyncio.wait_for(worker.finished(), WAIT)
        assert worker.sessions == 1

    with caplog.at_level(logging.WARNING, logger="apportion.worker"):
        run(scenario)
    assert "could not reconnect" in caplog.text and "within 0.5s" in caplog.text


@pytest.mark.timeout(30)
def test_close_while_reconnecting_stops_promptly() -> None:
    async def scenario(scheduler: FakeScheduler) -> None:
        worker = await Worker(scheduler.address, nthreads=1, reconnect_timeout=60).start()
        conn, _ = await scheduler.next_worker()
        assert scheduler._server is not None
        scheduler._server.close()
        await scheduler._server.wait_closed()
        await conn.close()
        while worker._scheduler is not None:
            await asyncio.sleep(0.01)  # polling: no event marks the start of reconnecting
        await asyncio.wait_for(worker.close(), WAIT)

    run(scenario)


def test_liveness_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="heartbeat_interval"):
        Worker("tcp://127.0.0.1:1", heartbeat_interval=0)
    with pytest.raises(ValueError, match="reconnect_timeout"):
        Worker("tcp://127.0.0.1:1", reconnect_timeout=-1)


@pytest.mark.tcp
@pytest.mark.timeout(30)
def test_sync_context_manager_runs_on_its_own_loop() -> None:
    loop_thread = LoopThread()
    try:
        scheduler = loop_thread.run(FakeScheduler("127.0.0.1").start())
        with Worker(scheduler.address, nthreads=1, name="sync") as worker:
            conn, hello = loop_thread.run(scheduler.next_worker(), WAIT)
            assert hello.name == "sync" and worker.address.startswith("tcp://127.0.0.1:")
            send_and_wait = _send_and_expect(scheduler, conn, compute("x", add, 1, 2))
            assert loop_thread.run(send_and_wait, WAIT).key == "x"
        loop_thread.run(scheduler.close(), WAIT)
    finally:
        loop_thread.stop()


async def _send_and_expect(
    scheduler: FakeScheduler, conn: Connection, messages: list[Message]
) -> TaskFinished:
    send(conn, messages)
    return await scheduler.expect(conn, TaskFinished)


@pytest.mark.tcp
@pytest.mark.timeout(30)
def test_unreachable_scheduler_is_a_clear_error() -> None:
    async def scenario() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        worker = Worker(f"tcp://127.0.0.1:{port}", nthreads=1)
        with pytest.raises(OSError, match="cannot connect"):
            await worker.start()
        await asyncio.wait_for(worker.finished(), WAIT)

    asyncio.run(scenario())


#: What each ``secede_then_rejoin`` saw, in order (the worker runs in this process).
REJOINS: list[str] = []


def secede_then_rejoin() -> str:
    apportion.secede()
    try:
        apportion.rejoin()
        outcome = f"rejoined holding {apportion.task_resources()}"
    except concurrent.futures.CancelledError as exc:
        outcome = f"cancelled: {exc}"
    REJOINS.append(outcome)
    return outcome


@pytest.mark.timeout(30)
def test_a_task_waiting_to_rejoin_runs_on_when_granted_or_is_cancelled_with_the_session() -> None:
    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=1, name="w", resources="GPU=1"):
            conn, _ = await scheduler.next_worker()
            send(conn, compute("granted", secede_then_rejoin, resources={"GPU": 10_000}))
            assert await scheduler.expect(conn, TaskSeceded) == TaskSeceded("granted", False)
            await scheduler.expect(conn, TaskRejoining)
            conn.send(RejoinGranted(["granted"]))
            finished = await scheduler.expect(conn, TaskFinished)
            assert finished.key == "granted"
            reply = await get(conn, scheduler, "granted")
            assert loads(reply.data["granted"]) == "rejoined holding {'GPU': 1.0}"

            send(conn, compute("lost", secede_then_rejoin, resources={"GPU": 10_000}))
            await scheduler.expect(conn, TaskRejoining)
            await conn.close()  # the scheduler declares the worker lost: no grant comes
            conn, _ = await scheduler.next_worker()
            while len(REJOINS) < 2:
                await asyncio.sleep(0.01)
            assert REJOINS[1] == (
                "cancelled: task 'lost' cannot rejoin: the worker lost its scheduler, "
                "which runs the task elsewhere"
            )

    REJOINS.clear()
    run(scenario)

"""Mistakes a newcomer makes get one line saying what is wrong, not a traceback.

Command-line checks run in-process with click's CliRunner; real processes are
used only where the behaviour is about processes (a worker that waits for its
scheduler, a script's exit, Ctrl-C).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import socket
import socketserver
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion import Client, LocalCluster
from apportion.cli.main import main
from apportion.cli.submit import INTERRUPTED
from apportion.core.resources import (
    describe_amount,
    describe_resources,
    format_resources,
    is_byte_pool,
    parse_amount,
    parse_demand,
    parse_supply,
)
from apportion.net.address import ACCEPTED_FORMS
from apportion.net.handshake import HandshakeError, open_connection
from apportion.net.scheduler_file import write_scheduler_file
from apportion.net.security import Security, user_secret
from apportion.protocol.handshake import Refused
from apportion.protocol.tasks import SubmitTasks, TaskSpec
from apportion.protocol.worker import RegisterWorker
from apportion.scheduler.events import WorkerJoined
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.state import SchedulerConfig
from apportion.testing.simulation import SimulatedCluster
from apportion.worker.detect import split_auto
from apportion.worker.service import Worker
from cli_processes import APPORTION, Processes, free_port, poll


@pytest.fixture(autouse=True, scope="module")
def _secret() -> None:
    """This account's secret exists, as it does once any scheduler has run: the clients
    here get as far as the peer, whatever ran before them."""
    user_secret(create=True)


BAD_ADDRESSES = ["http://host:8786", "host:abc", "host:99999", "tcp://", ""]


def one_error_line(output: str) -> str:
    """The output's only line, which must be an ``Error:`` line."""
    lines = output.splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("Error: "), output
    return lines[0]


# --- 1. malformed addresses ------------------------------------------------------


@pytest.mark.parametrize("bad", BAD_ADDRESSES)
@pytest.mark.parametrize(
    "args",
    [
        ["worker", "{}"],
        ["submit", "--scheduler", "{}", "--", "true"],
        ["info", "--scheduler", "{}"],
        ["why", "some-key", "--scheduler", "{}"],
        ["dump", "{tmp}/state.json", "--scheduler", "{}"],
        ["runs", "--scheduler", "{}"],
        ["cancel", "7", "--scheduler", "{}"],
    ],
    ids=lambda args: args[0],
)
def test_a_malformed_address_is_one_line_and_status_2(
    args: list[str], bad: str, tmp_path: Path
) -> None:
    argv = [a.format(bad, tmp=tmp_path) if "{" in a else a for a in args]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2, result.output
    line = one_error_line(result.output)
    assert repr(bad) in line and ACCEPTED_FORMS in line


@pytest.mark.parametrize("bad", ["http://host:8786", "host:abc", "host:99999", "tcp://"])
def test_submit_takes_a_leading_address_and_refuses_a_malformed_one(bad: str) -> None:
    result = CliRunner().invoke(main, ["submit", bad, "--", "true"])
    assert result.exit_code == 2, result.output
    assert repr(bad) in one_error_line(result.output)


def test_a_malformed_address_from_the_environment_is_named_too() -> None:
    result = CliRunner().invoke(main, ["info"], env={"APPORTION_SCHEDULER": "http://h:8786"})
    assert result.exit_code == 2
    assert "'http://h:8786'" in one_error_line(result.output)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--host", "my host"], "'my host'"),
        (["--host", "http://h"], "'http://h'"),
        (["--port", "99999"], "'99999'"),
        (["--port", "abc"], "'abc'"),
    ],
)
@pytest.mark.parametrize(
    "command", [["scheduler", "--no-journal"], ["worker", "127.0.0.1:1"]], ids=lambda c: c[0]
)
def test_host_and_port_are_checked_in_one_line(
    command: list[str], args: list[str], named: str
) -> None:
    result = CliRunner().invoke(main, [*command, *args])
    assert result.exit_code == 2, result.output
    assert named in one_error_line(result.output)


def test_client_refuses_a_malformed_address_with_a_one_line_value_error() -> None:
    threads = threading.active_count()
    with pytest.raises(ValueError, match="invalid address 'http://h:8786'") as info:
        Client("http://h:8786")
    assert "\n" not in str(info.value) and ACCEPTED_FORMS in str(info.value)
    assert threading.active_count() == threads  # refused before any thread started


# --- 2. a port that is not apportion -----------------------------------------------


class _Http400(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.recv(1024)
        self.request.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


@pytest.fixture
def http_port() -> Iterator[int]:
    """A port that answers anything with an HTTP 400, as a web server does."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Http400)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never says a word."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


@pytest.mark.tcp
def test_client_at_an_http_port_says_what_answered(http_port: int) -> None:
    began = time.monotonic()
    with pytest.raises(HandshakeError) as info:
        Client(f"127.0.0.1:{http_port}", timeout=5)
    text = str(info.value)
    assert time.monotonic() - began < 3
    assert f"127.0.0.1:{http_port}" in text and "no apportion handshake" in text
    assert "b'HTTP/1.1 400 Bad Request" in text and "\n" not in text


@pytest.mark.tcp
def test_client_at_a_silent_port_fails_within_its_timeout(silent_port: int) -> None:
    began = time.monotonic()
    with pytest.raises(HandshakeError, match=r"no answer within 1s"):
        Client(f"127.0.0.1:{silent_port}", timeout=1)
    assert time.monotonic() - began < 3


@pytest.mark.tcp
def test_client_at_a_closed_port_says_it_waits_then_fails_within_its_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    began = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, logger="apportion.client"),
        pytest.raises(ConnectionRefusedError) as info,
    ):
        Client(f"127.0.0.1:{port}", timeout=2.5)
    waited = time.monotonic() - began
    assert 2.5 <= waited < 5
    assert str(info.value) == (
        f"cannot connect to 127.0.0.1:{port}: connection refused (tried for 2.5s)"
    )
    said = [r.getMessage() for r in caplog.records if r.name == "apportion.client"]
    assert said == [
        f"waiting for the scheduler at 127.0.0.1:{port} (connection refused) for up to 2.5s"
    ]


@pytest.mark.tcp
def test_asynchronous_client_at_a_closed_port_fails_within_its_timeout() -> None:
    port = free_port()

    async def connect() -> None:
        await Client(f"127.0.0.1:{port}", asynchronous=True, timeout=0.5)

    began = time.monotonic()
    with pytest.raises(ConnectionRefusedError, match=r"connection refused \(tried for 0.5s\)$"):
        asyncio.run(connect())
    assert 0.5 <= time.monotonic() - began < 3


@pytest.mark.tcp
def test_client_told_not_to_wait_for_its_scheduler_fails_at_once() -> None:
    port = free_port()
    began = time.monotonic()
    with pytest.raises(ConnectionRefusedError) as info:
        Client(f"127.0.0.1:{port}", timeout=30, wait_for_scheduler=False)
    assert time.monotonic() - began < 2  # not the 30 s timeout
    assert str(info.value) == f"cannot connect to 127.0.0.1:{port}: connection refused"


@pytest.mark.tcp
@pytest.mark.parametrize(
    "args",
    [
        ["info"],
        ["why"],
        ["status"],
        ["status", "--json"],
        ["dump", "{dump}"],
        ["submit", "--scheduler", "{address}", "--", "true"],
        ["runs"],
    ],
    ids=["info", "why", "status", "status-json", "dump", "submit", "runs"],
)
def test_a_command_at_a_closed_port_fails_at_once(args: list[str], tmp_path: Path) -> None:
    """A mistyped address is not a scheduler still starting: the command line tries once."""
    address = f"127.0.0.1:{free_port()}"
    args = [arg.format(dump=tmp_path / "dump.msgpack", address=address) for arg in args]
    if "--scheduler" not in args:
        args += ["--scheduler", address]
    began = time.monotonic()
    result = CliRunner().invoke(main, args)
    assert time.monotonic() - began < 5  # not a client's timeout
    assert result.exit_code == 1, result.output
    line = one_error_line(result.output)
    assert line.endswith(f"cannot connect to {address}: connection refused"), line


@pytest.mark.tcp
def test_info_at_an_http_port_is_one_line(http_port: int) -> None:
    result = CliRunner().invoke(main, ["info", "--scheduler", f"127.0.0.1:{http_port}"])
    assert result.exit_code == 1
    assert "b'HTTP/1.1 400" in one_error_line(result.output)


@pytest.mark.tcp
def test_a_worker_at_an_http_port_says_so_and_does_not_wait(http_port: int) -> None:
    async def start() -> None:
        await Worker(f"127.0.0.1:{http_port}", 1, connect_timeout=30).start()

    began = time.monotonic()
    with pytest.raises(HandshakeError, match=r"no apportion handshake: an HTTP server answered"):
        asyncio.run(start())
    assert time.monotonic() - began < 5  # a wrong peer is not retried


# --- 3. a worker started before its scheduler -------------------------------------


@pytest.mark.tcp
def test_worker_class_waits_for_a_scheduler_that_starts_later() -> None:
    from apportion.scheduler.service import Scheduler

    port = free_port()

    async def scenario() -> int:
        worker = Worker(f"127.0.0.1:{port}", 1, connect_timeout=20)
        starting = asyncio.create_task(worker.start())
        await asyncio.sleep(0.5)
        assert not starting.done()  # still trying, not failed
        async with Scheduler("127.0.0.1", port) as scheduler:
            await asyncio.wait_for(starting, 10)
            for _ in range(100):  # the registration is on its way: wait for it
                if scheduler.state.workers:
                    break
                await asyncio.sleep(0.05)
            joined = len(scheduler.state.workers)
            await worker.close()
        return joined

    assert asyncio.run(scenario()) == 1


@pytest.mark.tcp
def test_worker_class_with_no_connect_timeout_tries_once() -> None:
    async def start() -> None:
        await Worker(f"127.0.0.1:{free_port()}", 1).start()

    with pytest.raises(ConnectionRefusedError, match="connection refused"):
        asyncio.run(start())


@pytest.mark.process
@pytest.mark.timeout(30)
def test_worker_process_started_first_registers_once_the_scheduler_starts(
    procs: Processes,
) -> None:
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    _, log = procs.start("worker", address, "--name", "early", "--connect-timeout", "20")
    poll(lambda: "retrying for up to 20s" in log.read_text(), 10, "the waiting line")
    time.sleep(1)
    procs.start_scheduler("--port", str(port), "--no-journal")
    with Client(address, timeout=10) as client:
        poll(lambda: client.scheduler_info()["workers"], 15, "the worker to register")
        names = [w["name"] for w in client.scheduler_info()["workers"].values()]
    assert names == ["early"]
    assert log.read_text().count("retrying for up to") == 1  # one line while waiting


@pytest.mark.process
@pytest.mark.timeout(30)
def test_worker_process_gives_up_after_its_connect_timeout() -> None:
    address = f"127.0.0.1:{free_port()}"
    done = subprocess.run(
        [*APPORTION, "worker", address, "--connect-timeout", "0.5"],
        capture_output=True,
        text=True,
        timeout=25,
    )
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "connection refused; gave up after 0.5s" in errors[0]
    assert "Traceback" not in done.stderr


@pytest.mark.process
@pytest.mark.timeout(60)
@pytest.mark.parametrize("given", ["address", "scheduler_file"])
def test_client_made_before_its_scheduler_process_connects_once_it_listens(
    procs: Processes, tmp_path: Path, given: str
) -> None:
    """A script that starts ``apportion scheduler`` in the background and makes its
    client at once, as Dask's tests of queues and variables in tasks do; or a
    scheduler file that names a scheduler not listening yet."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    where: dict[str, Any] = {"address": address}
    if given == "scheduler_file":
        token = user_secret(create=True)
        assert token is not None
        write_scheduler_file(tmp_path / "cluster.json", address, token, "not-started-yet")
        where = {"scheduler_file": str(tmp_path / "cluster.json")}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        connecting = pool.submit(Client, **where, timeout=30, set_as_default=False)
        time.sleep(1)  # the scenario: the scheduler starts a second later
        assert not connecting.done()  # still trying, not failed
        procs.start("scheduler", "--port", str(port), "--no-journal")
        with connecting.result(timeout=40) as client:
            assert client.scheduler_info()["address"] == address


@pytest.mark.process
@pytest.mark.timeout(60)
def test_asynchronous_client_made_before_its_scheduler_process_connects_once_it_listens(
    procs: Processes,
) -> None:
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"

    async def scenario() -> str:
        connecting = asyncio.ensure_future(
            Client(address, asynchronous=True, timeout=30, set_as_default=False).__aenter__()
        )
        await asyncio.sleep(1)  # the scenario: the scheduler starts a second later
        assert not connecting.done()  # still trying, not failed
        procs.start("scheduler", "--port", str(port), "--no-journal")
        client = await asyncio.wait_for(connecting, 40)
        try:
            info = await client.scheduler_info()
        finally:
            await client.close()
        return str(info["address"])

    assert asyncio.run(scenario()) == address


# --- 4. no asyncio noise at a script's exit -------------------------------------

NOISE = ("Task was destroyed", "Event loop is closed", "ResourceWarning", "Traceback")


def run_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", str(script)],
        capture_output=True,
        text=True,
        timeout=50,
    )


@pytest.mark.process
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "setup",
    [
        "client = Client(LocalCluster(processes=False, n_workers=1, threads_per_worker=1))",
        "cluster = LocalCluster(n_workers=1, threads_per_worker=1)\nclient = Client(cluster)",
    ],
    ids=["in-process", "processes"],
)
@pytest.mark.parametrize("close", [False, True], ids=["left-open", "closed"])
def test_a_script_exits_without_asyncio_noise(tmp_path: Path, setup: str, close: bool) -> None:
    done = run_script(
        tmp_path,
        "from apportion import Client, LocalCluster\n"
        f"{setup}\n"
        "print(sum(client.gather(client.map(lambda x: x + 1, range(4)))))\n"
        + ("client.close()\n" if close else ""),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "10"
    assert not [word for word in NOISE if word in done.stderr], done.stderr


@pytest.mark.process
@pytest.mark.timeout(60)
def test_ctrl_c_of_a_script_leaves_only_pythons_keyboard_interrupt(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            import time
            from apportion import Client, LocalCluster
            client = Client(LocalCluster(processes=False, n_workers=1, threads_per_worker=1))
            print("ready", flush=True)
            client.submit(time.sleep, 30).result()
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-W", "always::ResourceWarning", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGINT
    assert stderr.count("Traceback") == 1 and stderr.rstrip().endswith("KeyboardInterrupt")
    assert "Task was destroyed" not in stderr and "Exception in thread" not in stderr


# --- 5. duplicate worker names ----------------------------------------------------


def register(sim: SimulatedCluster, worker_id: str, name: str, address: str, sup: int = 0) -> None:
    sim.running[worker_id] = {}
    reg = RegisterWorker(name, address, 1, {}, 100, 0, {}, sup)
    sim.handle(WorkerJoined(worker_id, reg, sim.now))


def test_a_second_worker_under_a_taken_name_is_refused() -> None:
    sim = SimulatedCluster()
    register(sim, "w1", "gpu-box", "tcp://10.0.0.1:4000")
    register(sim, "w2", "gpu-box", "tcp://10.0.0.2:4000")
    assert list(sim.state.workers) == ["w1"]
    refused = [msg for msg in sim.to_workers["w2"] if isinstance(msg, Refused)]
    assert len(refused) == 1
    assert "a worker named 'gpu-box' is already connected from tcp://10.0.0.1:4000" in (
        refused[0].reason
    )
    assert any("refused the worker at tcp://10.0.0.2:4000" in log.text for log in sim.logs)
    check_invariants(sim.state)


def test_the_same_worker_reregistering_replaces_its_stale_record() -> None:
    sim = SimulatedCluster()
    register(sim, "w1", "a", "tcp://10.0.0.1:4000")
    sim.add_client()
    sim.submit("k")
    sim.place()
    # Reconnected (same data address) before the end of its old connection was seen.
    register(sim, "w2", "a", "tcp://10.0.0.1:4000")
    assert list(sim.state.workers) == ["w2"]
    assert sim.disconnected == ["w1"]
    assert sim.state.tasks["k"].worker in (None, "w2")  # the task runs again
    check_invariants(sim.state)


def test_a_supervisors_restarted_worker_takes_its_name_back() -> None:
    sim = SimulatedCluster()
    register(sim, "w1", "node-0", "tcp://10.0.0.1:4000", sup=77)
    register(sim, "w2", "node-0", "tcp://10.0.0.1:4100", sup=77)  # a new port, same supervisor
    assert list(sim.state.workers) == ["w2"]
    register(sim, "w3", "node-0", "tcp://10.0.0.9:4100", sup=77)  # same pid on another host
    assert list(sim.state.workers) == ["w2"]
    check_invariants(sim.state)


@pytest.mark.process
@pytest.mark.timeout(40)
def test_a_worker_process_with_a_taken_name_exits_with_one_line(procs: Processes) -> None:
    address = procs.scheduler()
    procs.start("worker", address, "--name", "dup", "--nthreads", "1")
    with Client(address, timeout=10) as client:
        poll(lambda: client.scheduler_info()["workers"], 15, "the first worker")
    done = subprocess.run(
        [*APPORTION, "worker", address, "--name", "dup", "--nthreads", "1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, done.stderr
    assert "refused it: a worker named 'dup' is already connected" in errors[0]
    assert "Traceback" not in done.stderr


# --- 6. resource specs refused in one line ---------------------------------------


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("gpu=[0-]", "'0-' is not a range"),
        ("gpu=[-3]", "'-3' is not a range"),
        ("gpu=[0--3]", "'0--3' is not a range"),
        ("auto auto", "'auto' is given twice"),
        ("auto,gpu=[0],auto", "'auto' is given twice"),
        ("", "is empty"),
        (" , ", "is empty"),
        ("gpu=[0-99999999]", "more than 65536 units"),
        ("memory=1e999999999", "too large"),
    ],
)
def test_malformed_resource_specs_are_refused_in_one_line(spec: str, says: str) -> None:
    result = CliRunner().invoke(main, ["worker", "127.0.0.1:1", "--resources", spec])
    assert result.exit_code == 2, result.output
    line = one_error_line(result.output)
    assert "--resources" in line and says in line


@pytest.mark.tcp
def test_none_says_no_resources_explicitly() -> None:
    port = free_port()
    argv = ["worker", f"127.0.0.1:{port}", "--resources", "none", "--connect-timeout", "0"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 1  # accepted (status 2 is bad input); the port is closed


SPEC_CHARS = "gpuGPUmemory=[]0123456789-,. \tautoeEkKiBgb+_:x"


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(SPEC_CHARS, max_size=30), st.text(max_size=20)))
def test_any_spec_parses_to_a_supply_that_round_trips_or_is_a_value_error(spec: str) -> None:
    try:
        _, rest = split_auto(spec)
        amounts, units = parse_supply(rest)
    except ValueError:
        return
    text = format_resources(amounts, units)
    assert parse_supply(text) == (amounts, units)


# --- 7. why of a key the scheduler does not know -------------------------------------


def slow_inc(x: int) -> int:
    return x + 1


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(
        processes=False, n_workers=1, threads_per_worker=1, resources={"memory": 100e9}
    ) as local:
        yield local


@pytest.mark.tcp
def test_why_of_an_unknown_key_exits_1_with_one_line(cluster: LocalCluster) -> None:
    result = CliRunner().invoke(
        main, ["why", "no-such-key", "--scheduler", cluster.scheduler_address]
    )
    assert result.exit_code == 1
    assert "'no-such-key'" in one_error_line(result.output)


@pytest.mark.tcp
def test_why_of_a_known_key_exits_0(cluster: LocalCluster) -> None:
    with Client(cluster) as client:
        future = client.submit(slow_inc, 1, key="known")
        assert future.result() == 2
        result = CliRunner().invoke(
            main, ["why", "known", "--scheduler", cluster.scheduler_address]
        )
    assert result.exit_code == 0, result.output
    assert result.output.startswith("known: finished")


# --- 8. memory in human units ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "amount", "text"),
    [
        ("memory", "100e9", "93.1 GiB"),
        ("MEMORY", "16GiB", "16 GiB"),
        ("mem", "512", "512 B"),
        ("gpu_memory", "1.5GiB", "1.5 GiB"),
        ("scratch_bytes", "2TiB", "2 TiB"),
        ("memory", "1023.99MiB", "1 GiB"),
        ("GPU", "100e9", "100000000000"),  # not a byte pool: the exact number
        ("licence", "0.5", "0.5"),
        ("memoryless", "2048", "2048"),
    ],
)
def test_describe_amount_uses_binary_units_for_byte_pools(
    name: str, amount: str, text: str
) -> None:
    assert describe_amount(name, parse_amount(amount)) == text


def test_byte_pools_are_named_so() -> None:
    assert [
        n for n in ("Memory", "MEM", "host_memory", "x_bytes", "bytes", "gpu") if is_byte_pool(n)
    ] == [
        "Memory",
        "MEM",
        "host_memory",
        "x_bytes",
    ]


def test_describe_resources_for_people_and_format_resources_stays_exact() -> None:
    amounts, units = parse_supply("memory=100e9 gpu=[0,1] GPU=2")
    assert describe_resources(amounts, units) == "GPU=2 gpu=[0,1] memory=93.1 GiB"
    assert parse_supply(format_resources(amounts, units)) == (amounts, units)


def test_unsatisfiable_memory_error_and_join_log_use_human_units() -> None:
    sim = SimulatedCluster(SchedulerConfig(fail_unsatisfiable=True))
    sim.add_worker("worker-0", resources={"memory": 100e9})
    assert any("resources memory=93.1 GiB" in log.text for log in sim.logs)
    sim.add_client()
    sim.client_says(
        "c1",
        SubmitTasks(
            [TaskSpec("big", "f", b"", [], parse_demand("memory=120GiB"), 0, 0)],
            {"f": b"func"},
            ["big"],
        ),
    )
    sim.place()
    error = sim.state.tasks["big"].error
    assert error is not None
    assert "needs memory=120 GiB" in str(error[1])
    assert "largest memory supply is 93.1 GiB on worker-0" in str(error[1])


@pytest.mark.tcp
def test_info_shows_memory_in_gib(cluster: LocalCluster) -> None:
    result = CliRunner().invoke(main, ["info", "--scheduler", cluster.scheduler_address])
    assert result.exit_code == 0, result.output
    assert "memory 93.1 GiB/93.1 GiB free" in result.output
    assert "100000000000" not in result.output


# --- 9. Ctrl-C of submit --wait ---------------------------------------------------------


@pytest.mark.process
@pytest.mark.timeout(40)
def test_ctrl_c_of_submit_wait_says_the_runs_go_on(procs: Processes, tmp_path: Path) -> None:
    _, address, _ = procs.start_scheduler("--port", "0", "--journal", str(tmp_path / "runs.db"))
    proc = subprocess.Popen(
        [*APPORTION, "submit", address, "--resources", "gpu=1", "--wait", "--", "true"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        submitted = proc.stdout.readline()
        assert submitted.startswith("submitted run 1"), submitted
        proc.stdout.readline()  # the first progress line: it is following now
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == INTERRUPTED == 130
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines == [
        # No worker is connected: said at once, and not an error (one may join).
        f"note: no worker is connected to {address} yet: run 1 will wait for one",
        f"interrupted: run 1 goes on; cancel with apportion cancel 1 --scheduler {address}",
    ]


def test_why_text_of_a_waiting_memory_task_uses_human_units() -> None:
    from apportion.scheduler.explain import explain

    sim = SimulatedCluster()
    sim.add_worker("worker-0", nthreads=2, resources={"memory": 100e9})
    sim.add_client()
    specs = [TaskSpec(key, "f", b"", [], parse_demand("memory=60GiB"), 0, 0) for key in ("a", "b")]
    sim.client_says("c1", SubmitTasks(specs, {"f": b"func"}, ["a", "b"]))
    sim.place()
    text = explain(sim.state, "b")
    assert "queued: needs memory=60 GiB" in text
    assert "worker-0: memory 33.1 GiB of 93.1 GiB free" in text
    assert explain(sim.state, "a").endswith("holding memory=60 GiB")
    check_invariants(sim.state)


@pytest.mark.tcp
def test_a_peer_that_hangs_up_at_once_is_not_called_foreign() -> None:
    """A worker that died while a peer connected: said as such, not as a foreign port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]

        def hang_up() -> None:
            conn, _ = sock.accept()
            conn.close()

        thread = threading.Thread(target=hang_up)
        thread.start()
        with pytest.raises(HandshakeError) as info:
            asyncio.run(
                open_connection(
                    f"127.0.0.1:{port}", "peer", "test", security=Security.in_memory(), timeout=5
                )
            )
        thread.join(5)
    text = str(info.value)
    # A close with our Hello unread is a reset on Linux; either way, not "foreign".
    assert "the handshake did not complete: the peer" in text
    assert "no apportion handshake" not in text

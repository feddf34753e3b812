"""Who may talk to a cluster, checked from outside as an attacker would: real scheduler
and worker processes, raw sockets that lie, replay and stall, a second Unix user,
fuzzed frames, a slow-loris crowd, a TLS cluster, the modes of the files a scheduler
leaves behind, and a scheduler file as the only credential.

Every attempt to smuggle code in carries a pickle whose unpickling creates a file:
the file's absence is the proof that nothing was unpickled, and a control sent over
an authenticated connection shows the same frame does create it when it is allowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import hashlib
import json
import os
import re
import resource
import secrets
import shutil
import socket
import stat
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import msgpack
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import apportion
from apportion import Client, Scheduler, Worker
from apportion.core.payload import dumps
from apportion.home import write_private
from apportion.net import auth
from apportion.net.certificates import temporary_certificates
from apportion.net.handshake import HANDSHAKE_TIMEOUT, open_connection
from apportion.net.receive_pool import POOL
from apportion.net.scheduler_file import read_scheduler_file
from apportion.net.security import AuthenticationError, Security, secret_path
from apportion.protocol.base import _REGISTRY, PROTOCOL_VERSION, Message
from apportion.protocol.cluster import InfoRequest, RestartRequest
from apportion.protocol.codec import HEADER, MAX_BODY
from apportion.protocol.handshake import AuthChallenge, AuthHello, AuthProof, Hello, Welcome
from apportion.protocol.peer_data import GetData, PutData
from apportion.protocol.remote_calls import CallOnWorkers, InstallOnWorkers
from apportion.protocol.tasks import GatherRequest, SubmitTasks, TaskSpec, WhoHasRequest
from apportion.scheduler.invariants import check_invariants
from cli_processes import APPORTION, Processes, poll
from raw_peer import (
    answers_until_hang_up,
    challenge,
    connect,
    frame,
    hello_frame,
    hung_up,
    prove,
    refused,
    smuggled,
)
from tls_certificates import issue
from unix_users import interpreter_for, no_python_reason

pytestmark = pytest.mark.tcp

# Worker processes are fresh interpreters that cannot import this test module:
# send its functions by value, as functions of a user's script are.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TARGETS = ("scheduler", "data port")


def inc(x: int) -> int:
    return x + 1


def slow_inc(x: int, delay: float) -> int:
    time.sleep(delay)
    return x + 1


def secret() -> bytes:
    """The secret every process of this test session finds in its APPORTION_HOME."""
    return secret_path().read_text().strip().encode()


@contextlib.contextmanager
def cluster(procs: Processes) -> Iterator[tuple[Client, dict[str, tuple[str, Path]]]]:
    """A scheduler and one worker as CLI processes, and a client of theirs; where each
    target listens, and the log of the process behind it."""
    _, address, scheduler_log = procs.start_scheduler("--port", "0")
    _, worker_log = procs.start("worker", address, "--nthreads", "1", "--name", "w")
    with Client(address, timeout=20) as client:
        client.wait_for_workers(1, timeout=20)
        (data_port,) = client.scheduler_info()["workers"]
        yield client, {"scheduler": (address, scheduler_log), "data port": (data_port, worker_log)}


def logged(log: Path, text: str) -> bool:
    return text in log.read_text()


def attempt(address: str, send: list[bytes], then: bytes) -> list[Message]:
    """Connect, send the frames ``send`` and then ``then`` (all at once, as a peer that
    does not wait to be refused), and collect what the listener says before it hangs
    up (it must hang up)."""
    with connect(address) as sock:
        sock.sendall(b"".join([*send, then]))
        return answers_until_hang_up(sock)


def after_challenge(address: str, key: bytes | None, then: bytes) -> list[Message]:
    """Open a handshake, wait for the listener's challenge, answer it with a proof made
    with ``key`` (None: no proof) and send ``then`` at once; what the listener says
    before it hangs up."""
    ours = auth.new_nonce()
    with connect(address) as sock:
        sock.sendall(hello_frame("client", "raw-peer", ours))
        nonce = challenge(sock).nonce
        proof = b""
        if key is not None:
            made = auth.proof(key, auth.CONNECTOR, "client", "raw-peer", ours, nonce)
            proof = frame(AuthProof(made))
        sock.sendall(proof + then)
        return answers_until_hang_up(sock)


@pytest.mark.timeout(60)
@pytest.mark.process
def test_unauthenticated_peers_are_refused_and_nothing_they_send_is_unpickled(
    procs: Processes, tmp_path: Path
) -> None:
    with cluster(procs) as (client, targets):
        running = client.submit(slow_inc, 1, 1.0)  # in flight while the attacks go on
        wrong = Security(token="x" * 32, token_source="a guess")
        for target, (address, _) in targets.items():

            def witness(attack: str, target: str = target) -> Path:
                return tmp_path / f"unpickled-{target.replace(' ', '-')}-{attack}"

            def payload(attack: str, target: str = target) -> bytes:
                return smuggled(target, witness(attack))

            # No AuthHello: a peer of an older apportion, or one hoping to skip the proof.
            hello = frame(Hello(PROTOCOL_VERSION, "client", "raw-peer"))
            said = attempt(address, [hello], payload("no-auth-hello"))
            assert refused(said, "no authentication offered"), said
            # No handshake at all: the payload first.
            assert attempt(address, [], payload("no-hello")) == []
            # The payload where the proof belongs.
            said = after_challenge(address, None, payload("payload-as-proof"))
            assert refused(said, "authentication failed"), said
            # A wrong secret: the listener's proof does not check out, so a real client
            # gives up at once; a raw one answers with a proof made from its guess.
            with pytest.raises(AuthenticationError, match="does not know the secret"):
                asyncio.run(open_connection(address, "client", "guess", security=wrong))
            said = after_challenge(address, wrong.key(), payload("wrong-secret"))
            assert refused(said, "authentication failed"), said
            # A replay: what a legitimate client sent, recorded and sent again.
            with connect(address) as sock:
                (welcome,), recording = prove(sock, secret())
                assert isinstance(welcome, Welcome)
            said = attempt(address, [recording.hello, recording.proof], payload("replayed"))
            assert isinstance(said[0], AuthChallenge)
            assert refused(said, "authentication failed"), said

        # The legitimate client was served all along, and still is.
        assert running.result(timeout=20) == 2
        assert client.submit(inc, 41).result(timeout=20) == 42
        assert sorted(tmp_path.glob("unpickled-*")) == []
        # Refusals are said once per host and minute: the first one is in the log.
        first = "refused a connection from 127.0.0.1: no authentication offered"
        for target, (_, log) in targets.items():
            poll(functools.partial(logged, log, first), 10, f"the {target}'s refusal")

        # The control: the same frame sent after a correct proof is unpickled. Data put
        # on the data port is stored as it came, and unpickled by whoever reads it.
        for target, (address, _) in targets.items():
            control = tmp_path / f"control-{target.replace(' ', '-')}"
            with connect(address) as sock:
                (welcome,), _ = prove(sock, secret())
                assert isinstance(welcome, Welcome)
                sock.sendall(smuggled(target, control))
                if target == "data port":
                    key = f"smuggled-{control.name}"

                    def read(dask_worker: Any, key: str = key) -> bool:
                        return key in dask_worker.data and dask_worker.data[key] is None

                    poll(lambda: any(client.run(read).values()), 20, "the control to be stored")
                poll(control.exists, 20, f"the {target} to unpickle the control")


@pytest.mark.timeout(60)
@pytest.mark.process
def test_a_stalled_handshake_is_dropped_after_the_timeout_and_others_are_served_meanwhile(
    procs: Processes,
) -> None:
    with cluster(procs) as (client, targets), contextlib.ExitStack() as sockets:
        stalled: list[tuple[str, socket.socket]] = []
        opened = time.monotonic()
        for target, (address, _) in targets.items():
            half_header = sockets.enter_context(connect(address))
            half_header.sendall(hello_frame()[:6])
            no_proof = sockets.enter_context(connect(address))
            no_proof.sendall(hello_frame())
            challenge(no_proof)
            stalled += [
                (f"{target}: half a header", half_header),
                (f"{target}: no proof", no_proof),
            ]
        # Served while those are pending, by both listeners (gather reads a data port).
        assert client.submit(inc, 1).result(timeout=20) == 2
        assert client.gather(client.submit(inc, 2), direct=True) == 3
        assert not any(hung_up(sock) for _, sock in stalled)
        for what, sock in stalled:
            sock.settimeout(HANDSHAKE_TIMEOUT + 10)
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(1) == b"", what
            waited = time.monotonic() - opened
            assert HANDSHAKE_TIMEOUT - 1 < waited < HANDSHAKE_TIMEOUT + 5, (what, waited)
        first = f"did not complete the handshake within {HANDSHAKE_TIMEOUT:g}s"
        for target, (_, log) in targets.items():
            poll(functools.partial(logged, log, first), 10, f"the {target}'s refusal")
        assert client.submit(inc, 3).result(timeout=20) == 4


# --- fuzzing ------------------------------------------------------------------------------

#: Messages an authenticated client may legitimately send that run code on the
#: workers or reset the cluster: a fuzzed tag never becomes one of them, since what is
#: tested is how malformed frames are handled, not what an authenticated peer may do.
CONSEQUENTIAL = {RestartRequest.TAG, CallOnWorkers.TAG, InstallOnWorkers.TAG}
#: Examples of the fuzzing test: about 10 s on two cores.
FUZZ_EXAMPLES = 2000
#: The nonce of fuzzed hellos (any will do: their proofs are never made).
NONCE = bytes(32)
TAGS = [tag for tag in range(-1, len(_REGISTRY) + 3) if tag not in CONSEQUENTIAL]

#: A few valid frames each target serves after the handshake, to mutate.
SERVED = {
    "scheduler": [
        [InfoRequest(1)],
        [GatherRequest(2, ["k"], 0), WhoHasRequest(3, ["k"])],
        [SubmitTasks([TaskSpec("k", "f", dumps((-1,)), [], {}, 0, 0)], {"f": b"?"}, [])],
    ],
    "data port": [[GetData(1, ["k"], False)], [PutData(2, {"k": dumps(1)})]],
}

#: Any value msgpack carries, to put where a field belongs.
INTEGERS = st.integers(-(2**63), 2**64 - 1)
ANY_VALUE = st.recursive(
    st.none()
    | st.booleans()
    | INTEGERS
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8)),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=5) | INTEGERS, inner, max_size=4)
    ),
    max_leaves=8,
)


def mutated_wire(data: st.DataObject, messages: list[Message]) -> bytes:
    """A frame of ``messages`` with one message's tag, a field, or its length changed."""
    wire = [list(message.to_wire()) for message in messages]
    item = data.draw(st.sampled_from(wire))
    change = data.draw(st.sampled_from(["tag", "field", "longer", "shorter"]))
    if change == "tag":
        item[0] = data.draw(st.sampled_from(TAGS))
    elif change == "field" and len(item) > 1:
        item[data.draw(st.integers(1, len(item) - 1))] = data.draw(ANY_VALUE)
    elif change == "longer":
        item.append(data.draw(ANY_VALUE))
    else:
        item.pop()
    body: bytes = msgpack.packb(wire, use_bin_type=True)
    return HEADER.pack(len(body), 0) + body


def mutated_bytes(data: st.DataObject, valid: bytes) -> bytes:
    """``valid`` truncated, with bytes overwritten or appended, or a header that lies
    about the body's length or the number of buffers."""
    change = data.draw(st.sampled_from(["truncate", "overwrite", "append", "body", "buffers"]))
    body, count = HEADER.unpack(valid[: HEADER.size])
    rest = valid[HEADER.size :]
    if change == "truncate":
        return valid[: data.draw(st.integers(0, len(valid) - 1))]
    if change == "overwrite":
        out = bytearray(valid)
        for _ in range(data.draw(st.integers(1, 4))):
            out[data.draw(st.integers(0, len(out) - 1))] = data.draw(st.integers(0, 255))
        return bytes(out)
    if change == "append":
        return valid + data.draw(st.binary(min_size=1, max_size=64))
    if change == "body":
        # Up to MAX_BODY would be allocated for an authenticated peer, by design: kept to
        # what costs no GiB per example, and past the limit, which must be refused.
        lie = data.draw(st.integers(0, 1 << 20) | st.integers(MAX_BODY + 1, 2**64 - 1))
        return HEADER.pack(lie, count) + rest
    return HEADER.pack(body, data.draw(st.integers(0, 2**32 - 1))) + rest


def settled_rss(process: psutil.Process) -> int:
    """The resident memory of this process once what it keeps on purpose or by chance
    is let go: garbage in cycles, maps the receive pool keeps for reuse (up to its
    limit, by design), and freed memory the C allocator holds on to in the arenas
    of the service threads. What remains is what something still uses."""
    gc.collect()
    POOL.clear()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc only
    rss: int = process.memory_info().rss
    return rss


def hang_up_after(sock: socket.socket, data: bytes) -> None:
    """Send ``data``, say we are done sending, and wait for the listener to let go."""
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
    answers_until_hang_up(sock)


@pytest.mark.timeout(60)
def test_fuzzed_frames_cost_their_connection_only_and_leak_no_memory_or_descriptors() -> None:
    with (
        Scheduler(port=0) as scheduler,
        Worker(scheduler.address, nthreads=1) as worker,
        Client(scheduler.address, timeout=20) as client,
    ):
        client.wait_for_workers(1, timeout=20)
        assert client.submit(inc, 1).result(timeout=20) == 2
        targets = {"scheduler": scheduler.address, "data port": worker.address}
        key = scheduler.security.key()
        me = psutil.Process()
        rss, fds = settled_rss(me), me.num_fds()

        @settings(
            max_examples=FUZZ_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.data())
        def fuzz(data: st.DataObject) -> None:
            target = data.draw(st.sampled_from(TARGETS))
            kind = data.draw(st.sampled_from(["random", "hello", "after proof"]))
            with connect(targets[target]) as sock:
                if kind == "random":
                    hang_up_after(sock, data.draw(st.binary(max_size=200)))
                    return
                if kind == "hello":
                    messages = [Hello(PROTOCOL_VERSION, "client", "fuzz"), AuthHello(NONCE)]
                else:
                    (welcome,), _ = prove(sock, key)
                    assert isinstance(welcome, Welcome)
                    messages = data.draw(st.sampled_from(SERVED[target]))
                if data.draw(st.booleans()):
                    hang_up_after(sock, mutated_bytes(data, frame(*messages)))
                else:
                    hang_up_after(sock, mutated_wire(data, messages))

        fuzz()
        # Still serving, its books in order, and nothing held for the fuzzing peers.
        client.wait_for_workers(1, timeout=20)
        assert client.submit(inc, 2).result(timeout=20) == 3
        check_invariants(scheduler.state)
        poll(lambda: me.num_fds() <= fds + 4, 10, f"descriptors back to {fds} from {me.num_fds()}")
        grown = settled_rss(me) - rss
        print(f"fuzzing: RSS grew {grown / 2**20:.1f} MiB, descriptors {fds} -> {me.num_fds()}")
        assert grown < 100 * 2**20


# --- slow-loris -----------------------------------------------------------------------------

#: Connections the crowd opens, and the seconds between two bytes of each.
CROWD = 500
TRICKLE_INTERVAL = 0.5


class Trickle:
    """``count`` connections to ``address`` that each send the next byte of a hello
    frame every ``interval`` seconds, from a thread of their own; a connection the
    listener closes is closed here too."""

    def __init__(self, address: str, count: int, interval: float) -> None:
        self.hello = hello_frame()
        self.interval = interval
        self.open: list[socket.socket] = []
        self.closed_by_listener = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trickle", daemon=True)
        try:
            for _ in range(count):
                self.open.append(connect(address))
        except BaseException:
            self.close()
            raise
        self._thread.start()

    def _run(self) -> None:
        sent = 0
        while not self._stop.wait(self.interval):
            byte = self.hello[sent % len(self.hello) : sent % len(self.hello) + 1]
            sent += 1
            for sock in list(self.open):
                try:
                    sock.send(byte, socket.MSG_DONTWAIT)
                except OSError:  # dropped by the listener
                    self.open.remove(sock)
                    sock.close()
                    self.closed_by_listener += 1

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for sock in self.open:
            sock.close()


def median_latency(client: Client, count: int = 20) -> float:
    """Median seconds from submitting a task to holding its result."""
    times = []
    for i in range(count):
        start = time.perf_counter()
        assert client.submit(inc, i, pure=False).result(timeout=20) == i + 1
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@pytest.mark.timeout(60)
@pytest.mark.process
def test_a_slow_loris_crowd_costs_the_scheduler_bounded_descriptors_and_memory(
    procs: Processes,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4 * CROWD:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * CROWD), hard))
    scheduler, address, _ = procs.start_scheduler("--port", "0")
    procs.start("worker", address, "--nthreads", "1")
    process = psutil.Process(scheduler.pid)
    with Client(address, timeout=20) as client:
        client.wait_for_workers(1, timeout=20)
        before = median_latency(client)
        fds, rss = process.num_fds(), process.memory_info().rss
        crowd = Trickle(address, CROWD, TRICKLE_INTERVAL)
        try:
            during = median_latency(client)
            time.sleep(2 * TRICKLE_INTERVAL)  # every connection has sent a byte since
            fds_during, rss_during = process.num_fds(), process.memory_info().rss
            pending = len(crowd.open)
        finally:
            crowd.close()
        print(
            f"slow-loris: median latency {before * 1e3:.1f} ms before, {during * 1e3:.1f} ms "
            f"during {CROWD} trickling connections; scheduler descriptors {fds} -> "
            f"{fds_during}, RSS {rss / 2**20:.0f} -> {rss_during / 2**20:.0f} MiB; "
            f"{pending} of the crowd still connected"
        )
        # The gate keeps 64 handshakes pending per host: the rest were dropped.
        assert fds_during < fds + 64 + 20
        assert pending <= 64 + 20
        assert rss_during - rss < 100 * 2**20
        assert during < 2.0  # a sanity bound, not a benchmark
        assert client.submit(inc, 1).result(timeout=20) == 2


# --- a TLS cluster ----------------------------------------------------------------------------


def credentials(directory: Path) -> dict[str, tuple[str, str]]:
    """A CA and a certificate it signed for each role, written to ``directory`` (mode
    0600): role ("ca", "scheduler", "worker", "client") -> (certificate, key) paths."""
    ca_cert, ca_key = temporary_certificates()  # a CA: basicConstraints CA=True
    pems = {"ca": (ca_cert, ca_key)}
    pems |= {role: issue(ca_cert, ca_key, role) for role in ("scheduler", "worker", "client")}
    paths = {}
    for role, (cert, key) in pems.items():
        paths[role] = (str(directory / f"{role}.pem"), str(directory / f"{role}-key.pem"))
        write_private(Path(paths[role][0]), cert)
        write_private(Path(paths[role][1]), key)
    return paths


def tls_options(paths: dict[str, tuple[str, str]], role: str) -> list[str]:
    cert, key = paths[role]
    return ["--tls-cert", cert, "--tls-key", key, "--tls-ca", paths["ca"][0]]


def blob(nbytes: int) -> bytes:
    return os.urandom(nbytes)


def digest(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


@pytest.mark.timeout(60)
@pytest.mark.process
def test_a_tls_cluster_computes_across_data_ports_and_refuses_a_peer_without_a_certificate(
    procs: Processes, tmp_path: Path
) -> None:
    paths = credentials(tmp_path)
    file = tmp_path / "scheduler.json"
    _, address, log = procs.start_scheduler(
        "--port", "0", "--scheduler-file", str(file), *tls_options(paths, "scheduler")
    )
    assert address.startswith("tls://127.0.0.1:")
    for name in ("tls-a", "tls-b"):
        procs.start("worker", address, "--name", name, *tls_options(paths, "worker"))
    token = read_scheduler_file(file).token
    ca, (cert, key) = paths["ca"][0], paths["client"]
    security = Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, token=token)
    with Client(address, security=security, timeout=20) as client:
        client.wait_for_workers(2, timeout=20)
        assert all(a.startswith("tls://") for a in client.scheduler_info()["workers"])
        # 20 MB made on one worker, hashed on the other: it crosses a data port.
        big = client.submit(blob, 20_000_000, workers=["tls-a"])
        remote = client.submit(digest, big, workers=["tls-b"])
        assert remote.result(timeout=30) == digest(big.result(timeout=30))

    without = Security(tls_ca_file=ca, token=token)
    # Under TLS 1.3 the refusal reaches the client as the end of the connection.
    with pytest.raises(OSError, match=re.escape(address)):
        Client(address, security=without, timeout=5)
    refusal = r"TLS handshake with 127.0.0.1:\d+ failed: peer did not return a certificate"
    poll(lambda: re.search(refusal, log.read_text()), 10, "the scheduler to log the refusal")


# --- the files a scheduler leaves behind ------------------------------------------------------


def environment(home: Path) -> dict[str, str]:
    """This process's environment with ``home`` as APPORTION_HOME and no other
    apportion variable: no secret, scheduler or certificate comes from elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPORTION_")}
    return {**env, "APPORTION_HOME": str(home)}


def cli(*args: str, env: dict[str, str], **options: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*APPORTION, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        **options,
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.timeout(60)
@pytest.mark.process
def test_a_scheduler_keeps_its_home_and_every_file_in_it_private_to_its_owner(
    procs: Processes, tmp_path: Path
) -> None:
    home = tmp_path / "fresh-home"  # made by the scheduler
    env = environment(home)
    _, address, _ = procs.start_scheduler("--port", "0", env=env)
    procs.start("worker", address, "--nthreads", "1", env=env)
    run = cli("submit", address, "--wait", "--", "echo", "ran", env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert (home / "runs-logs" / "1.log").read_text() == "ran\n"

    assert mode(home) == 0o700
    for name in ("secret", "scheduler.json", "runs.db", "runs.db.lock"):
        assert mode(home / name) == 0o600, name
    assert mode(home / "runs-logs") == 0o700
    everything = list(home.rglob("*"))
    assert {mode(p) for p in everything if p.is_dir()} <= {0o700}, everything
    assert {mode(p) for p in everything if p.is_file()} == {0o600}, everything

    # A secret others may read is refused, saying how to make it private again.
    (home / "secret").chmod(0o644)
    info = cli("info", "--scheduler", address, env=env)
    assert info.returncode != 0
    assert f"chmod 600 {home / 'secret'}" in info.stderr


@pytest.mark.timeout(60)
@pytest.mark.process
def test_a_scheduler_file_is_all_a_worker_and_a_client_need(
    procs: Processes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "shared" / "scheduler.json"
    owner = environment(tmp_path / "owner")
    # The others' home holds no secret: whatever they prove comes from the file.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    env = environment(elsewhere)
    # Started first, as `srun` may: the worker waits for the file to be written.
    procs.start("worker", "--scheduler-file", str(file), "--name", "from-file", env=env)
    _, address, _ = procs.start_scheduler("--port", "0", "--scheduler-file", str(file), env=owner)
    for variable in os.environ:
        if variable.startswith("APPORTION_"):
            monkeypatch.delenv(variable)
    monkeypatch.setenv("APPORTION_HOME", str(elsewhere))
    with Client(scheduler_file=file, timeout=20) as client:
        assert client.scheduler_address == address
        client.wait_for_workers(1, timeout=20)
        assert client.submit(inc, 1).result(timeout=20) == 2
        (worker,) = client.scheduler_info()["workers"].values()
        assert worker["name"] == "from-file"
    assert not (elsewhere / "secret").exists()


# --- another user of the machine -----------------------------------------------------------

#: What the other user tries, as that user: each attempt's outcome printed as JSON.
INTRUDER = """
import asyncio, json, sys
from pathlib import Path

from apportion import Client
from apportion.net.handshake import open_connection
from apportion.net.security import Security

home, scheduler_file, address, data_port = sys.argv[1:5]
outcome = {}


def attempt(name, action):
    try:
        action()
        outcome[name] = "succeeded"
    except BaseException as exc:
        outcome[name] = f"{type(exc).__name__}: {exc}"


attempt("secret", lambda: Path(home, "secret").read_text())
attempt("scheduler file", lambda: Path(scheduler_file).read_text())
attempt("client", lambda: Client(address, timeout=5).close())
guess = Security(token="g" * 64, token_source="a guess")
attempt("guessed client", lambda: Client(address, security=guess, timeout=5).close())
attempt(
    "guessed data port",
    lambda: asyncio.run(open_connection(data_port, "client", "intruder", security=guess)),
)
print(json.dumps(outcome))
"""


@pytest.fixture
def other_user() -> Iterator[str]:
    """A system user made for this test, deleted after it however it ends."""
    if os.geteuid() != 0:
        pytest.skip("making a second Unix user needs root")
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not installed")
    name = f"apportion-other-{secrets.token_hex(4)}"
    subprocess.run(["useradd", "--system", "--no-create-home", name], check=True, timeout=30)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False, timeout=30)


@pytest.mark.timeout(60)
@pytest.mark.process
def test_another_user_of_the_machine_can_neither_read_the_secret_nor_use_the_cluster(
    procs: Processes, other_user: str
) -> None:
    # Under /tmp, traversable by all as a home's parent is; tmp_path's parents are not.
    base = Path(tempfile.mkdtemp(prefix="apportion-users-"))
    try:
        base.chmod(0o755)
        home, file = base / "home", base / "scheduler.json"
        # The other user is pointed at the owner's files: only their modes stop them.
        intruder = {
            "HOME": str(base),
            "APPORTION_HOME": str(home),
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(Path(apportion.__file__).parents[1]),
        }
        found = interpreter_for(other_user, intruder)
        if found is None:
            pytest.skip(no_python_reason(other_user))
        python, intruder = found
        owner = environment(home)
        _, address, _ = procs.start_scheduler(
            "--port", "0", "--scheduler-file", str(file), env=owner
        )
        procs.start("worker", address, "--nthreads", "1", env=owner)
        token = read_scheduler_file(file).token
        with Client(address, security=Security(token=token), timeout=20) as client:
            client.wait_for_workers(1, timeout=20)
            (data_port,) = client.scheduler_info()["workers"]
            kept = client.submit(inc, 41)
            assert kept.result(timeout=20) == 42

            def as_other_user(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    [*python, *args],
                    env=intruder,
                    user=other_user,
                    group=other_user,
                    extra_groups=[],
                    cwd=base,
                    capture_output=True,
                    text=True,
                    timeout=40,
                )

            run = as_other_user("-c", INTRUDER, str(home), str(file), address, data_port)
            assert run.returncode == 0, run.stderr
            outcome = json.loads(run.stdout)
            assert outcome["secret"].startswith("PermissionError"), outcome
            assert outcome["scheduler file"].startswith("PermissionError"), outcome
            # Pointed at the owner's home, it is told so before anything is read.
            unreadable = (
                f"apportion home {home} belongs to another user (uid {os.geteuid()}): "
                "use a directory of your own (APPORTION_HOME)"
            )
            assert outcome["client"] == f"PrivateFileError: {unreadable}", outcome
            assert outcome["guessed client"].startswith("AuthenticationError"), outcome
            # Nor can it fetch the owner's results from the worker directly.
            assert outcome["guessed data port"].startswith("AuthenticationError"), outcome
            info = as_other_user("-m", "apportion.cli.main", "info", "--scheduler", address)
            assert info.returncode != 0
            assert unreadable in info.stderr
            # The owner's cluster is untouched.
            assert kept.result(timeout=20) == 42
    finally:
        shutil.rmtree(base, ignore_errors=True)

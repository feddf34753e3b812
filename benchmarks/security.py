"""Authentication and TLS: their cost per connection and in tiny-task throughput.

apportion authenticates every connection with an HMAC challenge-response in its
handshake (``net/handshake.py``, ``net/auth.py``): one round trip and two HMACs per
side more than a bare hello, paid once per connection, never per message. TLS
(``Security.temporary()``: mutual, a self-signed certificate for every role) adds its
own handshake and encrypts every byte after it. Three parts, in one run:

1. Handshake cost. ``--connections`` (200) connections opened one after another and
   closed, each timed from connect to close, to a server in a process of its own (as
   a scheduler is), in interleaved rounds:

   (b) the baseline: a TCP connect and ONE round trip of a small frame to an echo
       server, at the socket level, with no authentication;
   (a) apportion's full handshake with a scheduler (``open_connection`` as a client);
   (c) the same over TLS.

   Beside (a) and (c): the same with the proofs patched out of both processes
   (``Hello``, then ``Welcome``: one round trip; this benchmark only, ``src/``
   unchanged), so that authentication's own cost shows apart from apportion's
   framing and TLS. Median and p90 per connection, in microseconds.
2. Tiny-task throughput. ``--tasks`` (5,000) no-op tasks, ``map`` then ``gather``, on
   2 worker processes x 1 thread, best of a few runs as in throughput.py: apportion
   over TCP (authenticated: the default) and over TLS, Dask.distributed over TCP and
   over TLS (each system's ``Security.temporary()``). Tasks/s, TLS/TCP for each
   system and apportion/Dask for each transport.
3. Authentication's share of that throughput. Authentication costs only when a
   connection opens, so its share is (extra time of an authenticated handshake x
   connections the cluster opened) / wall time of the timed runs. The extra time is
   (a) - (b) over TCP (medians; it also holds apportion's own framing, so it is an
   upper bound) and (c) - (c without proofs) over TLS. Every connection opened since
   the cluster started is counted, start-up and warm-up included, against the timed
   runs' wall time alone: the share is overstated, never understated. Also, as a
   direct check: tasks/s on an in-process cluster (``processes=False``, where one
   patch covers every process's handshakes) with authentication and with its proofs
   patched out, two clusters of each in the order A B B A.

Usage: ``python benchmarks/security.py [--connections N] [--tasks N] [--repeat N]
[--min-runs N] [--budget S] [--systems apportion,dask]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import tasks
from harness import settle_apportion, settle_dask
from throughput import RunPlan, warm_up

tasks.share_with_workers()

N_CONNECTIONS = 200
N_TASKS = 5_000
#: Rounds the timed connections are split into, each variant in turn within a round,
#: so that a slow spell of the machine falls on every variant alike.
ROUNDS = 4
#: Untimed connections per variant first (imports, TLS contexts, caches).
WARM_CONNECTIONS = 20
#: The baseline's frame out and answer back: about an apportion Hello and Welcome.
REQUEST_BYTES = 64
ANSWER_BYTES = 160
#: The most authentication may take of the tiny-task run's wall time (percent).
SHARE_LIMIT = 5.0


# --- authentication patched out (this benchmark's processes only) ---------------------


async def _hello_only(
    conn: Any, stream: Any, address: str, role: str, name: str, key: bytes, source: str
) -> Any:
    """The connecting side of a handshake without proofs: ``Hello``, then ``Welcome``."""
    from apportion.net import handshake
    from apportion.protocol.base import PROTOCOL_VERSION
    from apportion.protocol.handshake import Hello, Welcome

    conn.send(Hello(PROTOCOL_VERSION, role, name))
    return handshake._expect(await handshake._first_frame(stream), Welcome, address)


async def _hello_accepted(conn: Any, roles: set[str], key: bytes) -> Any:
    """The listener's side of a handshake without proofs: any ``Hello`` of a served role."""
    from apportion.net.handshake import HandshakeError
    from apportion.protocol.handshake import Hello

    batch = await conn.recv()
    hello = batch[0] if len(batch) == 1 else None
    if not isinstance(hello, Hello) or hello.role not in roles:
        raise HandshakeError(f"{conn.peer} did not start with a handshake")
    return hello


@contextlib.contextmanager
def authentication_off() -> Iterator[None]:
    """Meanwhile, this process's handshakes prove nothing (both sides of it)."""
    from apportion.net import handshake

    saved = handshake._prove, handshake._check
    handshake._prove, handshake._check = _hello_only, _hello_accepted
    try:
        yield
    finally:
        handshake._prove, handshake._check = saved


# --- the servers of part 1, each in a process of its own --------------------------------


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One round trip: a length-prefixed frame in, ``ANSWER_BYTES`` out; then wait for
    the peer to close."""
    try:
        size = int.from_bytes(await reader.readexactly(4), "big")
        await reader.readexactly(size)
        writer.write(b"w" * ANSWER_BYTES)
        await writer.drain()
        await reader.read()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def serve(kind: str, proofs: bool) -> None:
    """Serve ``kind`` ("echo" or "scheduler", credentials from the environment) on
    loopback, print the address, and stop when stdin closes (the benchmark ended)."""
    if kind == "echo":
        server = await asyncio.start_server(_echo, "127.0.0.1", 0)
        host, port = server.sockets[0].getsockname()[:2]
        print(f"tcp://{host}:{port}", flush=True)
        await asyncio.to_thread(sys.stdin.buffer.read)
        server.close()
        return
    from apportion.net.security import Security
    from apportion.scheduler.service import Scheduler

    with contextlib.nullcontext() if proofs else authentication_off():
        scheduler = await Scheduler("127.0.0.1", 0, security=Security.from_environment()).start()
        print(scheduler.address, flush=True)
        await asyncio.to_thread(sys.stdin.buffer.read)
        await scheduler.close()


@contextlib.contextmanager
def server_process(kind: str, proofs: bool, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """This script serving ``kind`` in a child process; closed (killed if need be) after."""
    command = [sys.executable, __file__, "--serve", kind]
    if not proofs:
        command.append("--no-proofs")
    child = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ | env
    )
    try:
        yield child
    finally:
        assert child.stdin is not None
        with contextlib.suppress(OSError):
            child.stdin.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def address_of(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if not line:
        raise RuntimeError(f"a server process ended before listening (exit {child.wait()})")
    return line


# --- part 1: handshakes ------------------------------------------------------------------


async def bare_round_trip(host: str, port: int) -> None:
    """The baseline: connect, one small frame out, a small answer back, close."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await loop.sock_connect(sock, (host, port))
        await loop.sock_sendall(sock, REQUEST_BYTES.to_bytes(4, "big") + b"h" * REQUEST_BYTES)
        got = 0
        while got < ANSWER_BYTES:
            chunk = await loop.sock_recv(sock, ANSWER_BYTES - got)
            if not chunk:
                raise ConnectionError("the echo server closed early")
            got += len(chunk)
    finally:
        sock.close()


async def apportion_handshake(address: str, security: Any) -> None:
    """apportion's handshake as a client, then close."""
    from apportion.net.handshake import open_connection

    conn, _ = await open_connection(address, "client", "security-bench", security=security)
    await conn.close()


@dataclass
class Variant:
    label: str
    connect: Callable[[], Awaitable[None]]
    #: Whether this side proves the secret (False: ``authentication_off`` meanwhile).
    proofs: bool = True
    seconds: list[float] = field(default_factory=list)

    @property
    def median_us(self) -> float:
        return statistics.median(self.seconds) * 1e6

    @property
    def p90_us(self) -> float:
        return statistics.quantiles(self.seconds, n=10)[8] * 1e6


async def time_handshakes(variants: list[Variant], n: int) -> None:
    """``n`` timed connections of each variant, in ``ROUNDS`` interleaved rounds."""
    per_round = math.ceil(n / ROUNDS)
    for variant in variants:
        with contextlib.nullcontext() if variant.proofs else authentication_off():
            for _ in range(WARM_CONNECTIONS):
                await variant.connect()
    for _ in range(ROUNDS):
        for variant in variants:
            gc.collect()
            with contextlib.nullcontext() if variant.proofs else authentication_off():
                for _ in range(per_round):
                    start = time.perf_counter()
                    await variant.connect()
                    variant.seconds.append(time.perf_counter() - start)


def handshakes(n: int) -> dict[str, Variant]:
    """Part 1: every variant timed against its own server process; printed."""
    from apportion.net.security import Security

    tcp, tls = Security.in_memory(), Security.temporary()
    tcp_env, tls_env = tcp.environment("scheduler"), tls.environment("scheduler")
    with contextlib.ExitStack() as stack:
        children = {
            "echo": stack.enter_context(server_process("echo", True, {})),
            "tcp": stack.enter_context(server_process("scheduler", True, tcp_env)),
            "tcp-bare": stack.enter_context(server_process("scheduler", False, tcp_env)),
            "tls": stack.enter_context(server_process("scheduler", True, tls_env)),
            "tls-bare": stack.enter_context(server_process("scheduler", False, tls_env)),
        }
        address = {name: address_of(child) for name, child in children.items()}
        host, port = address["echo"].removeprefix("tcp://").rsplit(":", 1)
        variants = {
            "b": Variant(
                "(b) TCP connect + 1 round trip, no authentication",
                partial(bare_round_trip, host, int(port)),
            ),
            "a0": Variant(
                "    apportion, TCP, proofs patched out",
                partial(apportion_handshake, address["tcp-bare"], tcp),
                proofs=False,
            ),
            "a": Variant(
                "(a) apportion, TCP, authenticated",
                partial(apportion_handshake, address["tcp"], tcp),
            ),
            "c0": Variant(
                "    apportion, TLS, proofs patched out",
                partial(apportion_handshake, address["tls-bare"], tls),
                proofs=False,
            ),
            "c": Variant(
                "(c) apportion, TLS, authenticated",
                partial(apportion_handshake, address["tls"], tls),
            ),
        }
        asyncio.run(time_handshakes(list(variants.values()), n))
    print()
    print(f"Handshake cost: {n} connections each, opened and closed one after another")
    header = f"{'connection':<52} {'median us':>10} {'p90 us':>8}"
    print(header)
    print("-" * len(header))
    for variant in variants.values():
        print(f"{variant.label:<52} {variant.median_us:>10,.0f} {variant.p90_us:>8,.0f}")
    print(
        f"authentication adds, by medians: (a) - (b) = {extra(variants, 'a', 'b'):,.0f} us; "
        f"over apportion without proofs: TCP {extra(variants, 'a', 'a0'):,.0f} us, "
        f"TLS {extra(variants, 'c', 'c0'):,.0f} us",
        flush=True,
    )
    return variants


def extra(variants: dict[str, Variant], with_: str, without: str) -> float:
    """Microseconds ``with_`` takes beyond ``without``, by medians."""
    return variants[with_].median_us - variants[without].median_us


# --- part 2: tiny-task throughput ----------------------------------------------------------


@dataclass
class Throughput:
    rate: float
    runs: int
    #: Wall time of the timed runs, summed (seconds).
    timed: float
    #: Connections apportion's cluster opened, by the connecting role and where it
    #: connected ("scheduler" or "worker"): before the timed runs, and during them.
    before: Counter[str] | None = None
    during: Counter[str] | None = None


def independent(client: Any, n: int) -> int:
    client.gather(client.map(tasks.noop, range(n), pure=False))
    return n


def measure(client: Any, settle: Callable[[], None], plan: RunPlan, n: int) -> Throughput:
    """Best tasks/s of ``n`` no-op tasks, under throughput.py's rule for how many runs."""
    best, spent, runs = 0.0, 0.0, 0
    while runs < plan.max_runs and (runs < plan.min_runs or spent < plan.budget):
        settle()
        start = time.perf_counter()
        independent(client, n)
        elapsed = time.perf_counter() - start
        spent, runs = spent + elapsed, runs + 1
        best = max(best, n / elapsed)
    return Throughput(best, runs, spent)


def accepted(client: Any, here: dict[str, int], processes: bool) -> Counter[str]:
    """Handshakes completed so far: by this process's listeners (the scheduler's; with
    ``processes=False`` the workers' too) since ``here``, and by each worker process's
    data port (``tasks.count_handshakes``, installed at start-up)."""
    now = Counter(tasks.count_handshakes())
    now.subtract(here)
    place = "scheduler" if processes else "this process"
    counts = Counter({f"{role}->{place}": n for role, n in now.items() if n})
    if processes:
        for worker in client.run(tasks.count_handshakes).values():
            counts.update({f"{role}->worker": n for role, n in worker.items()})
    return counts


def run_apportion(
    label: str, plan: RunPlan, n: int, *, tls: bool = False, processes: bool = True
) -> Throughput:
    """The tiny-task workload on a fresh apportion cluster, its connections counted.

    How connections are counted: each one is counted once, where it is accepted, when
    its handshake completes (``tasks.count_handshakes`` wraps the listener's side of the
    handshake). In this process the wrapper is in place before the cluster starts, so
    every connection to the scheduler counts: the client's, each worker's, any
    supervisor's. In each worker process it is put in place by ``client.run`` right
    after start-up (``run`` goes through the scheduler, and no worker's data port is
    reached before the first task), so every connection to a data port counts: other
    workers' (peers), the client's (gathering results) and the scheduler's (relays).
    In-process, every listener is in this process and the wrapper counts them all
    (under "scheduler", as they cannot be told apart there).
    """
    from apportion import Client, LocalCluster
    from apportion.net.security import Security

    here = tasks.count_handshakes()
    security = Security.temporary() if tls else None
    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=processes, security=security
    )
    try:
        client = Client(cluster)
        try:
            if processes:
                client.run(tasks.count_handshakes)
            warm_up(client)
            before = accepted(client, here, processes)
            result = measure(client, partial(settle_apportion, client), plan, n)
            result.before = before
            result.during = accepted(client, here, processes) - before
        finally:
            client.close()
    finally:
        cluster.close()
    print(f"  {label:<40} {result.rate:>8,.0f} tasks/s  (best of {result.runs})", flush=True)
    return result


def run_dask(label: str, plan: RunPlan, n: int, *, tls: bool = False) -> Throughput:
    import distributed
    from distributed.security import Security

    options = {"security": Security.temporary()} if tls else {}
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, **options
    )
    try:
        client = distributed.Client(cluster)
        try:
            warm_up(client)
            result = measure(client, partial(settle_dask, client), plan, n)
        finally:
            client.close()
    finally:
        cluster.close()
    print(f"  {label:<40} {result.rate:>8,.0f} tasks/s  (best of {result.runs})", flush=True)
    return result


def in_process_pair(plan: RunPlan, n: int) -> tuple[Throughput, Throughput]:
    """Best tasks/s in-process with authentication and with the proofs patched out: two
    clusters of each, of 2 runs each, in the order A B B A (a cluster started later in
    a process runs faster: each gets its share of early and late)."""
    two = RunPlan(2, 2, plan.budget)
    best: dict[bool, Throughput] = {}
    for proofs in (True, False, False, True):
        label = "apportion in-process, " + ("authenticated" if proofs else "proofs patched out")
        with contextlib.nullcontext() if proofs else authentication_off():
            result = run_apportion(label, two, n, processes=False)
        if proofs not in best or result.rate > best[proofs].rate:
            best[proofs] = result
    return best[True], best[False]


# --- the report -----------------------------------------------------------------------------


def report_throughput(n: int, results: dict[str, Throughput]) -> None:
    print()
    print(f"Tiny-task throughput: {n:,} no-op tasks, map + gather, 2 worker processes x 1 thread")
    header = f"{'system':<16} {'TCP tasks/s':>12} {'TLS tasks/s':>12} {'TLS/TCP':>8}"
    print(header)
    print("-" * len(header))
    for system in ("apportion", "dask"):
        tcp, tls = results.get(f"{system} tcp"), results.get(f"{system} tls")
        print(
            f"{system:<16} {_rate(tcp):>12} {_rate(tls):>12} {_ratio(tls, tcp):>8}",
            flush=True,
        )
    a_tcp, a_tls = results.get("apportion tcp"), results.get("apportion tls")
    d_tcp, d_tls = results.get("dask tcp"), results.get("dask tls")
    if a_tcp and d_tcp:
        print(
            f"{'apportion/dask':<16} {_ratio(a_tcp, d_tcp):>12} {_ratio(a_tls, d_tls):>12}",
            flush=True,
        )


#: For each apportion run of part 2: the handshakes whose medians' difference is the
#: extra time of authenticating one connection, and how that is printed.
EXTRA_TIME = {
    "apportion tcp": ("a", "b", "(a) - (b)"),
    "apportion tls": ("c", "c0", "(c) - (c without proofs)"),
}


def report_share(variants: dict[str, Variant], results: dict[str, Throughput]) -> bool:
    """Part 3; whether every share is under ``SHARE_LIMIT``."""
    print()
    print("Authentication's share of the tiny-task runs (apportion, 2 worker processes):")
    print(
        "  every connection opened since the cluster started x the extra time of an "
        "authenticated handshake / the timed runs' wall time"
    )
    under = True
    for name, (with_, without, text) in EXTRA_TIME.items():
        result = results.get(name)
        if result is None or result.before is None or result.during is None:
            continue
        used = max(0.0, extra(variants, with_, without))
        total = sum(result.before.values()) + sum(result.during.values())
        share = 100 * used * 1e-6 * total / result.timed
        under = under and share < SHARE_LIMIT
        print(f"  {name}: {_counts(result.before)} before the timed runs,")
        timed = f"{result.runs} runs, {result.timed:.2f} s"
        print(f"    {_counts(result.during)} during them ({timed})")
        print(
            f"    {total} x {used:,.0f} us ({text}) / {result.timed:.2f} s = {share:.3f} %  "
            f"(under {SHARE_LIMIT:g} %: {'yes' if share < SHARE_LIMIT else 'NO'})",
            flush=True,
        )
    return under


def _counts(counts: Counter[str]) -> str:
    if not counts:
        return "none"
    total = sum(counts.values())
    return f"{total} ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})"


def _rate(result: Throughput | None) -> str:
    return "-" if result is None else f"{result.rate:,.0f}"


def _ratio(top: Throughput | None, bottom: Throughput | None) -> str:
    return "-" if top is None or bottom is None else f"{top.rate / bottom.rate:.2f}x"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--connections", type=int, default=N_CONNECTIONS, help="timed connections per variant"
    )
    parser.add_argument("--tasks", type=int, default=N_TASKS, help="no-op tasks per run")
    parser.add_argument("--repeat", type=int, default=3, help="most runs per cluster")
    parser.add_argument("--min-runs", type=int, default=2, help="fewest runs per cluster")
    parser.add_argument(
        "--budget", type=float, default=10.0, help="seconds per cluster before min-runs stops"
    )
    parser.add_argument("--systems", default="apportion,dask", help="comma-separated")
    parser.add_argument("--serve", choices=["echo", "scheduler"], help=argparse.SUPPRESS)
    parser.add_argument("--no-proofs", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, proofs=not args.no_proofs))
        return 0
    systems = args.systems.split(",")
    plan = RunPlan(args.repeat, min(args.min_runs, args.repeat), args.budget)
    start = time.perf_counter()
    variants = handshakes(args.connections)
    print()
    print(f"Tiny-task throughput ({args.tasks:,} no-op tasks):", flush=True)
    results: dict[str, Throughput] = {}
    if "apportion" in systems:
        results["apportion tcp"] = run_apportion("apportion, TCP (authenticated)", plan, args.tasks)
        results["apportion tls"] = run_apportion(
            "apportion, TLS (authenticated)", plan, args.tasks, tls=True
        )
        in_process = in_process_pair(plan, args.tasks)
    if "dask" in systems:
        results["dask tcp"] = run_dask("dask, TCP", plan, args.tasks)
        results["dask tls"] = run_dask("dask, TLS", plan, args.tasks, tls=True)
    report_throughput(args.tasks, results)
    under = True
    if "apportion" in systems:
        with_, without = in_process
        print()
        print(
            "In-process cluster (processes=False: 2 workers x 1 thread on the scheduler's "
            "loop), best of 4 runs each:"
        )
        print(
            f"  authenticated {with_.rate:,.0f} tasks/s, proofs patched out "
            f"{without.rate:,.0f} tasks/s: {_ratio(with_, without)}",
            flush=True,
        )
        under = report_share(variants, results)
    print(f"\n({time.perf_counter() - start:.0f} s in all)", flush=True)
    return 0 if under else 1


if __name__ == "__main__":
    sys.exit(main())

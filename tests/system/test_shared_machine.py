"""Two ordinary users on one machine, as on a login node or a lab's GPU box.

Each starts a scheduler, workers, runs and the dashboard with no options at all, at
the same time, in the machine's shared ``/tmp``; one of them also lays what traps an
account may lay for another (files and symlinks where apportion once kept state in
``/tmp``). Each user's commands must reach only their own cluster, nothing the other
planted may change anything, and a run whose worker is killed with SIGKILL must never
run twice: its command's processes are counted, as root, while the run starts again.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cli_processes import poll
from unix_users import UnixUser, skip_reason, unix_users

pytestmark = [pytest.mark.process, pytest.mark.tcp]

#: The test users' temporary directory: the machine's, shared by all (no TMPDIR).
SCRATCH = Path("/tmp")
#: Where a worker once listed its runs' process groups: a name shared by every user.
OLD_GROUPS_DIR = SCRATCH / "apportion-run-groups"


@pytest.fixture
def two_users() -> Iterator[list[UnixUser]]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    existed = OLD_GROUPS_DIR.exists()
    uids: set[int] = set()
    try:
        with unix_users(2) as users:
            uids.update(user.uid for user in users)
            yield users
    finally:
        if not existed:  # the trap laid there is this test's own
            shutil.rmtree(OLD_GROUPS_DIR, ignore_errors=True)
        # What the users' workers left in the shared directory, and the traps.
        for path in SCRATCH.glob("apportion-*"):
            with contextlib.suppress(OSError):
                if path.lstat().st_uid in uids:
                    if path.is_symlink() or not path.is_dir():
                        path.unlink()
                    else:
                        shutil.rmtree(path, ignore_errors=True)


def announced(user: UnixUser, pattern: str, timeout: float = 30) -> str:
    """The first match of ``pattern`` in what ``user``'s processes printed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, user.output())
        if found:
            return found.group(1)
        time.sleep(0.05)
    raise AssertionError(f"nothing matching {pattern!r} from {user.name}:\n{user.output()}")


def status(user: UnixUser) -> dict[str, object]:
    done = user.run("status", "--json")
    assert done.returncode == 0, done.stderr
    document: dict[str, object] = json.loads(done.stdout)
    return document


def wait_for_workers(user: UnixUser, count: int, timeout: float = 40) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        document = status(user)
        workers = document["workers"]
        assert isinstance(workers, list)
        if len(workers) == count:
            return document
        assert time.monotonic() < deadline, f"{user.name} has {len(workers)} workers"
        time.sleep(0.2)


def marked(marker: str) -> list[psutil.Process]:
    """The ``sleep`` processes of the runs whose environment carries ``marker``."""
    found = []
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] != "sleep":
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("RUN_MARKER") == marker:
                found.append(proc)
    return found


def workers_of(supervisor: int) -> list[psutil.Process]:
    """The worker processes of ``supervisor``: the children of its fork server (the
    default start method), else its own children."""
    children = psutil.Process(supervisor).children()
    if len(children) == 1 and "apportion.worker.fork_server" in children[0].cmdline():
        return children[0].children()
    return children


def worker_of(proc: psutil.Process, supervisor: int) -> psutil.Process:
    """The worker process (of ``supervisor``) that ``proc`` descends from."""
    workers = {w.pid for w in workers_of(supervisor)}
    for parent in proc.parents():
        if parent.pid in workers:
            return parent
    raise AssertionError(f"{proc} descends from no worker of supervisor {supervisor}")


@pytest.mark.timeout(240)
def test_two_users_run_clusters_side_by_side_and_neither_touches_the_other(
    two_users: list[UnixUser],
) -> None:
    mallory, alice = two_users
    # Both start a scheduler with no option at once: one of them cannot have the
    # default port, and falls back to another.
    mallory.start("scheduler")
    alice.start("scheduler")
    addresses = {
        user.name: announced(user, r"apportion scheduler at (tcp://\S+)")
        for user in (mallory, alice)
    }
    assert len(set(addresses.values())) == 2, addresses
    for user in (mallory, alice):
        document = json.loads((user.home / ".apportion" / "scheduler.json").read_text())
        assert document["address"] == addresses[user.name]
        assert document["dashboard"].startswith("http://127.0.0.1:")
        assert os.stat(user.home / ".apportion").st_uid == user.uid
        assert os.stat(user.home / ".apportion").st_mode & 0o077 == 0
    dashboards = {
        json.loads((u.home / ".apportion" / "scheduler.json").read_text())["dashboard"]
        for u in (mallory, alice)
    }
    assert len(dashboards) == 2, dashboards

    # Mallory lays traps where a worker once kept its list of process groups: a
    # directory of hers, a list naming Alice's scheduler's process group, and a
    # symlink to a file of Alice's.
    alice_scheduler = next(p for p in alice.processes() if "scheduler" in " ".join(p.cmdline()))
    victim = alice.home / "notes.txt"
    victim.write_text("mine\n")
    os.chown(victim, alice.uid, alice.uid)
    with contextlib.suppress(FileExistsError):
        OLD_GROUPS_DIR.mkdir(mode=0o755)
    os.chown(OLD_GROUPS_DIR, mallory.uid, mallory.uid)
    # ... and where workers keep their scratch directories, which a starting worker
    # clears of those its killed predecessors left: a directory of hers that looks
    # abandoned, and a link named as a worker's directory to a directory of Alice's
    # that looks abandoned too.
    precious = alice.home / "precious"
    precious.mkdir()
    for name, text in (("lock", ""), ("data", "keep\n")):
        (precious / name).write_text(text)
    decoy, link = (SCRATCH / f"apportion-worker-{secrets.token_hex(4)}" for _ in range(2))
    decoy.mkdir()
    (decoy / "lock").write_text("")
    link.symlink_to(precious)
    for path in (precious, precious / "lock", precious / "data"):
        os.chown(path, alice.uid, alice.uid)
    for path in (decoy, decoy / "lock", link):
        os.lchown(path, mallory.uid, mallory.uid)

    # Workers with no address find their own user's scheduler.
    mallory.start("worker", "--nthreads", "1")
    alice_supervisor = alice.start("worker", "--nworkers", "2", "--nthreads", "1")
    wait_for_workers(mallory, 1)
    wait_for_workers(alice, 2)
    # The traps are laid under the pids Alice's workers really have.
    listed, linked = (c.pid for c in workers_of(alice_supervisor.pid))
    _plant(mallory, OLD_GROUPS_DIR / str(listed), f"{alice_scheduler.pid}\n")
    _plant(mallory, OLD_GROUPS_DIR / str(linked), victim)

    # A run of each, with no option: each reaches its own cluster only.
    done = mallory.run("submit", "--wait", "--", "sh", "-c", "echo from-mallory")
    assert done.returncode == 0, done.stdout + done.stderr
    marker = secrets.token_hex(8)
    submitted = alice.run(
        "submit", "--", "sh", "-c", "sleep 300 & sleep 300; wait", env={"RUN_MARKER": marker}
    )
    assert submitted.returncode == 0, submitted.stderr
    first = poll(lambda: len(marked(marker)) == 2 and marked(marker), 40, "the run")
    mallory_runs = mallory.run("runs").stdout
    alice_runs = alice.run("runs").stdout
    assert "completed" in mallory_runs and "running" not in mallory_runs, mallory_runs
    assert "running" in alice_runs and "completed" not in alice_runs, alice_runs

    # SIGKILL the worker running Alice's run: its command dies with it, before the
    # run runs again, and never two copies at once.
    worker = worker_of(first[0], alice_supervisor.pid)
    old = {p.pid for p in first}
    worker.send_signal(signal.SIGKILL)
    most, deadline = 0, time.monotonic() + 15
    while time.monotonic() < deadline:
        now = marked(marker)
        most = max(most, len(now))
        if now and not old & {p.pid for p in now}:
            break  # started again, with only the new copy alive
        time.sleep(0.005)
    assert most <= 2, f"{most} sleep processes of one run at once"
    assert not old & {p.pid for p in marked(marker)}, "the killed worker's run outlived it"
    poll(lambda: len(marked(marker)) == 2, 40, "the run to start again")

    # Nothing Mallory planted did anything.
    assert (precious / "data").read_text() == "keep\n"
    assert (decoy / "lock").exists() and link.is_symlink()
    assert alice_scheduler.is_running()
    assert victim.read_text() == "mine\n"
    assert os.stat(victim).st_uid == alice.uid
    assert alice_supervisor.poll() is None
    for user in (mallory, alice):
        assert status(user)["scheduler"]["address"] == addresses[user.name]  # type: ignore[index]

    # Each one's login link opens their own dashboard, and no other.
    for user, other in ((alice, mallory), (mallory, alice)):
        link = user.run("status", "--link").stdout.strip()
        login = urllib.parse.urlsplit(link)
        cookie = dashboard_login(login.netloc, f"{login.path}?{login.query}")
        assert cookie is not None, link
        page = dashboard_get(login.netloc, "/api/status", cookie)
        assert json.loads(page)["scheduler"]["address"] == addresses[user.name]
        theirs = urllib.parse.urlsplit(dashboard_of(other))
        assert dashboard_login(theirs.netloc, f"{login.path}?{login.query}") is None
    alice.run("cancel", "1")


def dashboard_of(user: UnixUser) -> str:
    document = json.loads((user.home / ".apportion" / "scheduler.json").read_text())
    url: str = document["dashboard"]
    return url


def dashboard_login(netloc: str, target: str) -> str | None:
    """The session cookie a login link gives at the dashboard at ``netloc``; None if
    it is refused."""
    connection = http.client.HTTPConnection(netloc, timeout=10)
    try:
        connection.request("GET", target)
        response = connection.getresponse()
        response.read()
        cookie = response.getheader("Set-Cookie")
        if response.status != 303 or cookie is None:
            assert 400 <= response.status < 500, response.status
            return None
        return cookie.split(";", 1)[0]
    finally:
        connection.close()


def dashboard_get(netloc: str, target: str, cookie: str) -> bytes:
    connection = http.client.HTTPConnection(netloc, timeout=10)
    try:
        connection.request("GET", target, headers={"Cookie": cookie})
        response = connection.getresponse()
        body = response.read()
        assert response.status == 200, (response.status, body)
        return body
    finally:
        connection.close()


def _plant(mallory: UnixUser, path: Path, what: str | Path) -> None:
    """A file of Mallory's holding ``what``, or her symlink to the path ``what``."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    if isinstance(what, Path):
        path.symlink_to(what)
    else:
        path.write_text(what)
    os.lchown(path, mallory.uid, mallory.uid)

"""People the owner admits, with real processes: a scheduler and a CLI worker, the
owner's commands, a person's ``Client`` and ``apportion submit``, a stranger, and a
removal; the people, their runs and their quotas survive a restart of the scheduler."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from apportion import Client, LocalCluster
from apportion.protocol.tasks import GatherRequest, WhoHasRequest
from cli_processes import APPORTION, Processes, free_port, poll

pytestmark = [pytest.mark.process, pytest.mark.tcp, pytest.mark.timeout(120)]

#: Variables that would choose another scheduler or secret than the test's own.
CHOOSERS = ["APPORTION_SCHEDULER", "APPORTION_SCHEDULER_FILE", "APPORTION_TOKEN"]


@pytest.fixture
def owner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The owner's environment: an APPORTION_HOME of this test's own."""
    monkeypatch.setenv("APPORTION_HOME", str(tmp_path / "owner"))
    for name in [*CHOOSERS, "APPORTION_TOKEN_FILE"]:
        monkeypatch.delenv(name, raising=False)
    yield dict(os.environ)


def _run(env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """``apportion ARGS`` as a process with ``env``; its exit status checked if ``ok``."""
    done = subprocess.run(
        [*APPORTION, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    if ok:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def _person_env(owner: dict[str, str], home: Path) -> dict[str, str]:
    """Another person's environment: a home of their own, no secret of the owner's."""
    home.mkdir(mode=0o700)
    return {**owner, "APPORTION_HOME": str(home)}


#: The states ``apportion runs`` names (after the NAME column, which arrays fill).
STATES = {"staged", "queued", "running", "completed", "failed", "cancelled", "lost"}


def _runs(env: dict[str, str], *where: str) -> dict[int, str]:
    """Run id -> state, as ``apportion runs`` shows them to whoever asks ``where``."""
    out = _run(env, "runs", *where).stdout
    rows = [line.split() for line in out.splitlines()[1:] if line.strip()]
    return {int(row[0]): next(word for word in row[1:] if word in STATES) for row in rows}


def _start(procs: Processes, port: int, env: dict[str, str]) -> str:
    _, address, _ = procs.start_scheduler("--port", str(port), "--no-dashboard", env=env)
    return address


def test_a_person_works_alone_and_is_removed_without_touching_the_owner_s_work(
    procs: Processes, owner: dict[str, str], tmp_path: Path
) -> None:
    address = _start(procs, free_port(), owner)
    procs.start("worker", address, "--nthreads", "2", "--name", "w1", env=owner)
    alice_json = tmp_path / "alice.json"
    added = _run(
        owner, "user", "add", "alice", "--weight", "2", "--quota", "gpu=1", "-o", str(alice_json)
    )
    assert "admitted alice (kept in " in added.stdout
    assert alice_json.stat().st_mode & 0o777 == 0o600
    listed = _run(owner, "user", "list").stdout
    assert listed.splitlines()[1].split() == ["alice", "2", "0", "gpu=1"]
    alice = _person_env(owner, tmp_path / "alice-home")

    # A stranger (a wrong secret for alice, or a made-up cluster secret) is refused in one line.
    for token in ("person:alice:" + "0" * 64, "f" * 64):
        stranger = {**alice, "APPORTION_TOKEN": token}
        refused = _run(stranger, "info", "--scheduler", address, ok=False)
        assert refused.returncode == 1
        assert refused.stderr.startswith("Error: ") and refused.stderr.count("\n") == 1
        assert "does not know the secret" in refused.stderr

    # Alice's credential does not admit people, nor start workers.
    not_owner = _run(alice, "user", "list", "--scheduler-file", str(alice_json), ok=False)
    assert not_owner.stderr == "Error: only the cluster's owner may send ListPeople\n"

    with Client(address, timeout=20) as own, Client(scheduler_file=alice_json, timeout=20) as hers:
        held = own.submit(lambda: 1, key="owner-task")  # held: the task stays
        assert held.result(timeout=30) == 1
        mine = hers.submit(lambda x: x + 1, 41, key="alice-task")
        assert mine.result(timeout=30) == 42
        big = hers.submit(lambda: b"x" * (2 << 20), key="alice-big")
        assert len(big.result(timeout=30)) == 2 << 20  # relayed: no worker's port for her
        session = hers._link.connected
        with pytest.raises(PermissionError, match="alice may not use another person's tasks"):
            session.call(lambda rid: GatherRequest(rid, ["owner-task"]), 20)
        with pytest.raises(PermissionError):
            session.call(lambda rid: WhoHasRequest(rid, ["owner-task"]), 20)
        assert set(hers.who_has()) == {"alice-task", "alice-big"}
        assert {"owner-task", "alice-task"} <= set(own.who_has())

        # Runs: hers and the owner's; each sees theirs, the owner all.
        owner_run = _run(owner, "submit", "--", "sleep", "60").stdout
        sub = ["submit", "--scheduler-file", str(alice_json), "--", "sleep", "60"]
        _run(alice, *sub)
        _run(alice, *sub)  # two threads: this one waits behind the owner's and her first
        as_owner = ("--scheduler", address)
        as_alice = ("--scheduler-file", str(alice_json))
        poll(lambda: len(_runs(owner, *as_owner)) == 3, 20, "three runs")
        assert "submitted run 1" in owner_run
        assert set(_runs(alice, *as_alice)) == {2, 3}
        cancel_other = _run(alice, "cancel", "--scheduler-file", str(alice_json), "1", ok=False)
        assert cancel_other.returncode != 0
        poll(lambda: _runs(owner, *as_owner).get(2) == "running", 20, "alice's run to start")

        removed = _run(owner, "user", "remove", "alice").stdout
        assert "removed alice: 1 clients disconnected" in removed
        assert "2 runs cancelled" in removed
        poll(lambda: _gone(hers), 20, "alice's client to go")
        states = poll(
            lambda: (s := _runs(owner, *as_owner))[2] == "cancelled" and s, 30, "her runs to end"
        )
        assert states == {1: "running", 2: "cancelled", 3: "cancelled"}
        assert own.submit(lambda: 2, key="owner-after").result(timeout=30) == 2

    # Her credential no longer opens the cluster.
    gone = _run(alice, "runs", "--scheduler-file", str(alice_json), ok=False)
    assert gone.returncode != 0 and "does not know the secret" in gone.stderr


def _gone(client: Client) -> bool:
    try:
        client.who_has()
    except Exception:
        return True
    return False


def test_the_people_their_runs_and_quotas_survive_a_restart_of_the_scheduler(
    procs: Processes, owner: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    proc, address, _ = procs.start_scheduler("--port", str(port), "--no-dashboard", env=owner)
    bob_json = tmp_path / "bob.json"
    _run(owner, "user", "add", "bob", "--quota", "memory=2GiB", "-o", str(bob_json))
    assert _run(owner, "user", "list").stdout.splitlines()[1].split()[3:] == ["memory=2", "GiB"]
    people = json.loads((tmp_path / "owner" / "runs-people.json").read_text())
    assert [row["name"] for row in people["people"]] == ["bob"]
    bob_env = _person_env(owner, tmp_path / "bob-home")
    as_bob = ("--scheduler-file", str(bob_json))
    _run(bob_env, "submit", *as_bob, "--", "true")  # no worker yet: it waits in the journal
    _run(owner, "submit", "--", "true")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    assert _start(procs, port, owner) == address
    assert _run(owner, "user", "list").stdout.splitlines()[1].split()[0] == "bob"
    # His queued run is still there, still his; his share keeps its quota.
    assert _runs(bob_env, *as_bob) == {1: "queued"}
    assert _runs(owner, "--scheduler", address) == {1: "queued", 2: "queued"}
    shares = json.loads(_run(owner, "status", address, "--json").stdout)["shares"]
    (row,) = [row for row in shares if row["share"] == "bob"]
    assert row["kind"] == "person" and row["quota"] == {"memory": 2 * 2**30}
    procs.start("worker", address, "--nthreads", "1", "--name", "w1", env=owner)
    poll(lambda: _runs(bob_env, *as_bob) == {1: "completed"}, 30, "bob's run to complete")
    with Client(scheduler_file=bob_json, timeout=20) as bob:
        assert bob.submit(lambda: "still bob", key="b").result(timeout=30) == "still bob"


def test_two_people_share_a_local_cluster(owner: dict[str, str], tmp_path: Path) -> None:
    with LocalCluster(n_workers=1, threads_per_worker=2, dashboard_address=None) as cluster:
        token = cluster.security.token
        assert token is not None
        env = {**owner, "APPORTION_TOKEN": token}
        files = {name: tmp_path / f"{name}.json" for name in ("alice", "bob")}
        for name, path in files.items():
            where = ["--scheduler", cluster.scheduler_address]
            added = _run(env, "user", "add", name, *where, "-o", str(path))
            assert "kept in memory only: lost on restart" in added.stdout
        with (
            Client(scheduler_file=files["alice"], timeout=20) as alice,
            Client(scheduler_file=files["bob"], timeout=20) as bob,
        ):
            hers = alice.submit(lambda: "a", key="hers")
            his = bob.submit(lambda: "b", key="his")
            assert (hers.result(timeout=30), his.result(timeout=30)) == ("a", "b")
            assert set(alice.who_has()) == {"hers"} and set(bob.who_has()) == {"his"}
            with pytest.raises(PermissionError, match="bob may not use another person's tasks"):
                bob._link.connected.call(lambda rid: GatherRequest(rid, ["hers"]), 20)


def test_two_people_s_runs_share_a_cli_worker_s_gpus_and_status_names_the_quota(
    procs: Processes, owner: dict[str, str], tmp_path: Path
) -> None:
    address = _start(procs, free_port(), owner)
    procs.start("worker", address, "--nthreads", "4", "--resources", "GPU=2", env=owner)
    files = {name: tmp_path / f"{name}.json" for name in ("alice", "bob")}
    _run(owner, "user", "add", "alice", "-o", str(files["alice"]))
    _run(owner, "user", "add", "bob", "--quota", "GPU=1", "-o", str(files["bob"]))
    env = {name: _person_env(owner, tmp_path / f"{name}-home") for name in files}

    def submit(name: str, seconds: int, *args: str) -> None:
        where = ("--scheduler-file", str(files[name]), "--resources", "GPU=1")
        _run(env[name], "submit", *where, *args, "--", "sleep", str(seconds))

    as_owner = ("--scheduler", address)
    submit("alice", 2, "--array", "1-8")  # runs 1-8: 16 GPU-seconds, 8 s on two GPUs
    poll(lambda: list(_runs(owner, *as_owner).values()).count("running") == 2, 30, "2 running")
    # Bob's runs are long, so that the status is seen while the first runs: a loaded
    # machine may take a second or more per command.
    submit("bob", 20)  # run 9: the next freed GPU is his
    submit("bob", 20)  # run 10: held by his quota while 9 runs
    states = poll(
        lambda: (s := _runs(owner, *as_owner)).get(9) == "running" and s, 30, "bob's run to start"
    )
    alice_waiting = [i for i in range(1, 9) if states[i] == "queued"]
    assert len(alice_waiting) >= 3, f"bob's run started only as alice's queue emptied: {states}"
    assert states[10] == "queued"

    def shares_text() -> str:
        return _run({**owner, "COLUMNS": "200"}, "status", address).stdout

    text = poll(
        lambda: "bob: 1 waiting (GPU=1 x1), held by quota GPU=1" in (t := shares_text()) and t,
        20,
        "the status to name bob's quota",
    )
    lines = text.splitlines()
    shares = lines[lines.index("shares") + 1 :]
    assert shares[0].split() == ["share", "weight", "holds", "dominant", "fair", "quota"]
    rows = {line.split()[0]: line.split() for line in shares[1:3]}
    assert rows["alice"][1:3] == ["1", "GPU=1"] and rows["alice"][-1] == "-"
    assert rows["bob"][1:3] == ["1", "GPU=1"] and rows["bob"][-1] == "GPU=1"
    assert any(line.startswith("  alice: ") and "held by quota" not in line for line in lines)
    # Bob sees his own share only.
    mine = json.loads(
        _run(env["bob"], "status", "--scheduler-file", str(files["bob"]), "--json").stdout
    )
    assert [row["share"] for row in mine["shares"]] == ["bob"]

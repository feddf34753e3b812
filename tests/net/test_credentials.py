"""Where a process finds its secret, how the files holding it are kept, and when a
listener refuses to be reachable from the network in the clear."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from apportion.cli.main import main
from apportion.home import PrivateFileError, read_private, write_private
from apportion.net import security as sec
from apportion.net.scheduler_file import (
    SchedulerFileError,
    SchedulerFileMissing,
    read_scheduler_file,
    remove_scheduler_file,
    wait_for_scheduler_file,
    write_scheduler_file,
)
from apportion.net.security import (
    PlaintextRefused,
    Security,
    check_exposure,
    listening,
    security_for,
    stopped_listening,
)
from apportion.net.transport import TCP, TlsTransport, listener_for, transport_for

pytestmark = pytest.mark.timeout(30)

TOKEN = "t" * 40


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty APPORTION_HOME, and no secret in the environment."""
    where = tmp_path / "home"
    monkeypatch.setenv("APPORTION_HOME", str(where))
    for name in (sec.TOKEN_ENV, sec.TOKEN_FILE_ENV, sec.TLS_CERT_ENV, sec.TLS_KEY_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(sec.TLS_CA_ENV, raising=False)
    return where


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_users_secret_is_made_once_private_and_then_reused(home: Path) -> None:
    assert Security.from_environment().token is None  # connecting sides never make one
    made = Security.from_environment(create=True)
    assert made.token and len(made.token) == 64 and made.token_source == str(home / "secret")
    assert mode(home) == 0o700 and mode(home / "secret") == 0o600
    assert Security.from_environment().token == made.token


def test_the_environment_beats_the_users_secret(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Security.from_environment(create=True)
    holder = tmp_path / "token"
    write_private(holder, "f" * 32 + "\n")
    monkeypatch.setenv(sec.TOKEN_FILE_ENV, str(holder))
    assert Security.from_environment().token == "f" * 32
    monkeypatch.setenv(sec.TOKEN_ENV, TOKEN)
    found = Security.from_environment()
    assert (found.token, found.token_source) == (TOKEN, "APPORTION_TOKEN")


def test_a_secret_others_can_read_is_refused_saying_how_to_fix_it(home: Path) -> None:
    Security.from_environment(create=True)
    (home / "secret").chmod(0o644)
    with pytest.raises(PrivateFileError, match=r"open to other users \(mode 0644\).*chmod 600"):
        Security.from_environment()


def test_a_private_file_that_cannot_be_read_says_which(tmp_path: Path) -> None:
    with pytest.raises(PrivateFileError, match=r"cannot read token file .*missing"):
        read_private(tmp_path / "missing", "token file")


def test_the_scheduler_file_round_trips_and_is_private(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "scheduler.json"
    write_scheduler_file(path, "tcp://10.0.0.1:8786", TOKEN, "scheduler-1")
    assert mode(path) == 0o600
    found = read_scheduler_file(path)
    assert (found.address, found.token, found.id) == ("tcp://10.0.0.1:8786", TOKEN, "scheduler-1")
    assert json.loads(path.read_text())["type"] == "Scheduler"  # Dask's shape
    remove_scheduler_file(path, "scheduler-2")  # another scheduler's: kept
    assert path.exists()
    remove_scheduler_file(path, "scheduler-1")
    assert not path.exists()


def test_a_scheduler_file_path_may_start_with_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    write_scheduler_file(tmp_path / "cluster.json", "tcp://10.0.0.1:8786", TOKEN, "s")
    assert read_scheduler_file("~/cluster.json").address == "tcp://10.0.0.1:8786"


def test_a_bad_scheduler_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    write_private(path, "not json")
    with pytest.raises(SchedulerFileError, match="is not JSON"):
        read_scheduler_file(path)
    write_private(path, json.dumps({"id": "x"}))
    with pytest.raises(SchedulerFileError, match="names no address"):
        read_scheduler_file(path)
    write_private(path, json.dumps({"address": "tcp://h:1"}))  # Dask's: no token
    assert read_scheduler_file(path).token is None


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "node01", "::"])
def test_listening_on_the_network_in_the_clear_is_refused(host: str) -> None:
    with pytest.raises(
        PlaintextRefused, match=r"without TLS: give a certificate.*--allow-plaintext"
    ):
        check_exposure(host, Security(token=TOKEN), allow_plaintext=False)
    check_exposure(host, Security(token=TOKEN), allow_plaintext=True)
    check_exposure(host, Security(token=TOKEN, tls_scheduler_cert="c", tls_scheduler_key="k"),
                   allow_plaintext=False)  # fmt: skip


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "inproc://x"])
def test_loopback_and_memory_need_no_tls(host: str) -> None:
    check_exposure(host, Security(token=TOKEN), allow_plaintext=False)


def test_the_transport_follows_the_address_and_the_certificates() -> None:
    plain = Security(token=TOKEN)
    with_cert = Security(token=TOKEN, tls_scheduler_cert="c", tls_scheduler_key="k")
    assert transport_for("tcp://h:1", plain) is TCP
    assert isinstance(transport_for("tls://h:1", plain), TlsTransport)
    assert listener_for("127.0.0.1", plain) is TCP
    assert isinstance(listener_for("127.0.0.1", with_cert), TlsTransport)
    strict = Security(token=TOKEN, require_encryption=True)
    with pytest.raises(ValueError, match="encryption is required"):
        transport_for("tcp://h:1", strict)
    with pytest.raises(ValueError, match="needs a certificate and key"):
        listener_for("tls://0.0.0.0", None)


def test_a_process_connects_to_its_own_listeners_with_their_credentials(home: Path) -> None:
    own = Security.in_memory()
    listening("tcp://127.0.0.1:1", own)
    try:
        assert security_for("tcp://127.0.0.1:1") is own
        given = Security(token=TOKEN)
        assert security_for("tcp://127.0.0.1:1", given) is given
    finally:
        stopped_listening("tcp://127.0.0.1:1")
    assert security_for("tcp://127.0.0.1:1").token is None  # the environment's: none here


def test_the_environment_for_a_child_carries_the_secret_and_certificates() -> None:
    temporary = Security.temporary()
    env = temporary.environment("worker")
    assert env[sec.TOKEN_ENV] == temporary.token
    assert env[sec.TLS_CERT_ENV].startswith("-----BEGIN")
    assert set(env) == {sec.TOKEN_ENV, sec.TLS_CERT_ENV, sec.TLS_KEY_ENV, sec.TLS_CA_ENV}


def test_apportion_token_prints_the_secret_and_renews_it(home: Path) -> None:
    runner = CliRunner()
    first = runner.invoke(main, ["token"])
    assert first.exit_code == 0, first.output
    assert first.stdout.strip() == (home / "secret").read_text().strip()
    again = runner.invoke(main, ["token"])
    assert again.stdout == first.stdout
    renewed = runner.invoke(main, ["token", "--new"])
    assert renewed.exit_code == 0 and renewed.stdout.strip() != first.stdout.strip()
    assert renewed.stdout.strip() == (home / "secret").read_text().strip()


def test_the_scheduler_refuses_the_network_in_the_clear_in_one_line(home: Path) -> None:
    result = CliRunner().invoke(main, ["scheduler", "--host", "0.0.0.0", "--no-journal"])
    assert result.exit_code == 1
    assert "refusing to listen on 0.0.0.0 without TLS" in result.output
    assert "--allow-plaintext" in result.output


def test_a_client_takes_an_address_or_a_scheduler_file_not_both(tmp_path: Path) -> None:
    from apportion import Client

    path = tmp_path / "s.json"
    write_scheduler_file(path, "tcp://127.0.0.1:1", TOKEN, "s")
    with pytest.raises(ValueError, match="an address or a scheduler_file, not both"):
        Client("tcp://127.0.0.1:1", scheduler_file=path)


def test_the_worker_needs_an_address_or_a_scheduler_file(home: Path) -> None:
    # With neither, it waits for one of this user's schedulers, then fails in one line.
    result = CliRunner().invoke(main, ["worker", "--connect-timeout", "0.3"])
    assert result.exit_code == 1 and "no scheduler of yours is running" in result.output
    assert "--scheduler-file" in result.output
    unreadable = CliRunner().invoke(main, ["worker", "--scheduler-file", "/root/../proc/1/mem"])
    assert unreadable.exit_code == 2 and "scheduler file" in unreadable.output
    # Other commands do not wait for a scheduler file; a worker does, for its
    # --connect-timeout, then fails in one line.
    absent = os.devnull + "x"
    info = CliRunner().invoke(main, ["info", "--scheduler-file", absent])
    assert info.exit_code == 2 and f"no scheduler file at {absent}" in info.output
    waited = CliRunner().invoke(
        main, ["worker", "--scheduler-file", absent, "--connect-timeout", "0.3"]
    )
    assert waited.exit_code == 1
    assert f"no scheduler file at {absent}" in waited.output
    assert "after waiting 0.3 s" in waited.output


class FakeTime:
    """A clock that moves only when slept on, and a hook run at each sleep."""

    def __init__(self, on_sleep: Callable[[float], None] = lambda now: None) -> None:
        self.now = 0.0
        self.on_sleep = on_sleep

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.on_sleep(self.now)


def test_a_scheduler_file_is_waited_for_until_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / "later.json"

    def write_after_a_second(now: float) -> None:
        if now >= 1.0 and not path.exists():
            write_scheduler_file(path, "tcp://10.0.0.1:8786", TOKEN, "s")

    time = FakeTime(write_after_a_second)
    found = wait_for_scheduler_file(path, 5.0, sleep=time.sleep, clock=lambda: time.now)
    assert found.address == "tcp://10.0.0.1:8786"
    assert 1.0 <= time.now < 1.5


def test_waiting_for_a_scheduler_file_is_bounded(tmp_path: Path) -> None:
    time = FakeTime()
    path = tmp_path / "never.json"
    with pytest.raises(SchedulerFileMissing, match=r"after waiting 2 s"):
        wait_for_scheduler_file(path, 2.0, sleep=time.sleep, clock=lambda: time.now)
    assert time.now == pytest.approx(2.0)


def test_a_bad_scheduler_file_is_not_waited_on(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{")
    path.chmod(0o600)
    time = FakeTime()
    with pytest.raises(SchedulerFileError, match="is not JSON"):
        wait_for_scheduler_file(path, 60.0, sleep=time.sleep, clock=lambda: time.now)
    assert time.now == 0.0


def test_a_client_writes_a_scheduler_file_another_client_connects_with(
    tmp_path: Path, home: Path
) -> None:
    from apportion import Client

    path = tmp_path / "scheduler.json"
    with Client(processes=False, n_workers=1) as client:
        client.write_scheduler_file(path)
        assert mode(path) == 0o600
        # The secret is the cluster's own, made in memory: only the file carries it.
        assert read_scheduler_file(path).token == client.security.token
        with Client(scheduler_file=path) as other:
            assert other.submit(sum, [1, 2]).result() == 3


@pytest.mark.tcp
def test_a_local_cluster_or_worker_on_the_network_in_the_clear_needs_consent() -> None:
    from apportion import LocalCluster, Scheduler, Worker

    with pytest.raises(PlaintextRefused, match=r"refusing to listen on 0\.0\.0\.0"):
        LocalCluster(n_workers=0, processes=False, host="0.0.0.0")
    with LocalCluster(n_workers=0, processes=False, host="0.0.0.0", allow_plaintext=True) as c:
        assert c.scheduler_address.startswith("tcp://0.0.0.0:")

    async def worker_on(host: str, **options: bool) -> str:
        async with (
            Scheduler(port=0) as scheduler,
            Worker(scheduler.address, nthreads=1, host=host, **options) as worker,
        ):
            return worker.address

    with pytest.raises(PlaintextRefused, match=r"refusing to listen on 0\.0\.0\.0"):
        asyncio.run(worker_on("0.0.0.0"))
    assert asyncio.run(worker_on("0.0.0.0", allow_plaintext=True)).startswith("tcp://0.0.0.0:")


def _inc_through_the_cluster(x: int) -> int:
    from apportion import worker_client

    with worker_client() as client:  # gives its thread back while it waits
        return int(client.submit(abs, -x).result()) + 1


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_tls_cluster_runs_tasks_that_submit_tasks() -> None:
    import sys

    import cloudpickle

    from apportion import Client, LocalCluster

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, security=Security.temporary()) as cluster,
        Client(cluster) as client,
    ):
        assert cluster.scheduler_address.startswith("tls://")
        assert all(address.startswith("tls://") for address in client.scheduler_info()["workers"])
        assert client.gather(client.map(_inc_through_the_cluster, range(4))) == [1, 2, 3, 4]

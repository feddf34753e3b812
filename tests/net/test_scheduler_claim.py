"""The claim a scheduler holds on its scheduler file: one owner per file, a dead
owner's file taken over, and readers that tell a live file from a stale one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from apportion.net.discovery import Liveness
from apportion.net.scheduler_claim import (
    SchedulerFileBusy,
    SchedulerFileClaim,
    holder_of,
    lock_path,
    look,
    own_scheduler_files,
    probe,
    spare_path,
    take_spare,
)
from apportion.net.scheduler_file import write_scheduler_file


def test_a_held_file_cannot_be_claimed_again_and_says_by_whom(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.json"
    with SchedulerFileClaim.take(path) as claim:
        claim.note("tcp://127.0.0.1:8786")
        with pytest.raises(SchedulerFileBusy) as info:
            SchedulerFileClaim.take(path, patience=0.0)
        assert info.value.holder.pid == os.getpid()
        assert str(info.value) == (
            f"scheduler file {path} belongs to the running scheduler at "
            f"tcp://127.0.0.1:8786 (pid {os.getpid()})"
        )
        assert holder_of(path) == info.value.holder
        assert oct(lock_path(path).stat().st_mode & 0o777) == "0o600"
    # Released: the lock file is gone, and the next claim is free.
    assert not lock_path(path).exists() and holder_of(path) is None
    SchedulerFileClaim.take(path).release()


def test_release_is_idempotent_and_leaves_a_newer_owners_lock_alone(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.json"
    first = SchedulerFileClaim.take(path)
    first.release()
    second = SchedulerFileClaim.take(path)
    first.release()  # again: must not remove the second owner's lock
    assert lock_path(path).exists() and probe(path) is Liveness.LIVE
    second.release()


def test_a_spare_file_is_named_for_the_port_and_numbered_when_taken(tmp_path: Path) -> None:
    default = tmp_path / "scheduler.json"
    assert spare_path(default, 8790) == tmp_path / "scheduler-8790.json"
    with take_spare(default, 8790) as one, take_spare(default, 8790) as two:
        assert (one.path.name, two.path.name) == ("scheduler-8790.json", "scheduler-8790-2.json")
        for claim in (one, two):
            write_scheduler_file(claim.path, "tcp://127.0.0.1:8790", "t" * 32, claim.path.name)
        write_scheduler_file(default, "tcp://127.0.0.1:8786", "t" * 32, "default")
        names = [p.name for p in own_scheduler_files(default)]
        assert names == ["scheduler.json", "scheduler-8790-2.json", "scheduler-8790.json"]


def test_a_link_planted_at_the_lock_name_is_not_followed(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.json"
    target = tmp_path / "victim"
    target.write_text("untouched")
    lock_path(path).symlink_to(target)
    with pytest.raises(OSError):
        SchedulerFileClaim.take(path)
    assert target.read_text() == "untouched"
    assert probe(path) is Liveness.UNKNOWN


def test_look_tells_live_stale_and_unlocked_files_apart(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.json"
    assert look(path).found is None and not look(path).usable
    write_scheduler_file(path, "tcp://127.0.0.1:8786", "t" * 32, "s")
    # No lock file: written by something that takes none; taken at its word.
    assert look(path).liveness is Liveness.UNKNOWN and look(path).usable
    with SchedulerFileClaim.take(path):
        write_scheduler_file(path, "tcp://127.0.0.1:8786", "t" * 32, "s")
        assert look(path).liveness is Liveness.LIVE and look(path).usable
        lock_file = lock_path(path).read_bytes()
    lock_path(path).write_bytes(lock_file)  # as a killed owner leaves it: unlocked
    assert look(path).liveness is Liveness.STALE and not look(path).usable
    path.chmod(0o644)
    assert look(path).problem is not None and "open to other users" in str(look(path).problem)


OWNER = textwrap.dedent(
    """
    import sys, time
    from apportion.net.scheduler_claim import SchedulerFileClaim
    claim = SchedulerFileClaim.take(sys.argv[1])
    claim.note("tcp://127.0.0.1:1")
    print("held", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.process
@pytest.mark.timeout(30)
def test_the_file_of_an_owner_killed_with_sigkill_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.json"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline() == "held\n"
        with pytest.raises(SchedulerFileBusy, match=f"pid {owner.pid}"):
            SchedulerFileClaim.take(path)
        assert probe(path) is Liveness.LIVE
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        assert probe(path) is Liveness.STALE  # its lock file is left, but not held
        SchedulerFileClaim.take(path).release()
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)
        if owner.stdout is not None:
            owner.stdout.close()

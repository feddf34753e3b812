"""apportion's files belong to their user: directories of its own are refused when
another user owns them or may write to them, and nothing is written through a
symbolic link planted where a file of ours goes.

Tests that need a file of another user make one with ``chown``, so they run as root
only (CI); the others run as anyone.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from apportion.cli.main import main
from apportion.home import (
    PrivateFileError,
    home_dir,
    private_dir,
    read_private,
    user_dir,
    write_private,
)
from apportion.runs.journal import Journal, default_journal_path
from apportion.runs.writer import RunLogs
from apportion.worker.local_directory import LOCK, PREFIX, LocalDirectory, remove_stale

#: A user id that is not ours, for files made as root.
OTHER = 4321

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="making another user's file needs root")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_missing_home_is_made_for_its_user_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APPORTION_HOME", str(tmp_path / "a" / "home"))
    assert home_dir() == tmp_path / "a" / "home"
    assert mode(tmp_path / "a" / "home") == 0o700
    assert default_journal_path() == tmp_path / "a" / "home" / "runs.db"


def test_a_home_others_may_write_to_is_refused_saying_how_to_fix_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o777)
    monkeypatch.setenv("APPORTION_HOME", str(home))
    with pytest.raises(PrivateFileError) as caught:
        home_dir()
    assert str(caught.value) == (
        f"apportion home {home} is writable by other users (mode 0777): run `chmod go-w {home}`"
    )
    home.chmod(0o750)  # readable by a group is the user's choice
    assert home_dir() == home


def test_every_command_says_an_unsafe_home_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    home.chmod(0o1777)  # /tmp's mode: APPORTION_HOME=/tmp is refused
    monkeypatch.setenv("APPORTION_HOME", str(home))
    result = CliRunner().invoke(main, ["runs"])
    assert result.exit_code == 1
    assert result.output == (
        f"Error: apportion home {home} is writable by other users (mode 1777): "
        f"run `chmod go-w {home}`\n"
    )


def test_a_home_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(PrivateFileError, match="is not a directory"):
        private_dir(tmp_path / "file")


def test_a_link_of_ours_to_a_directory_of_ours_is_followed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert private_dir(tmp_path / "link") == tmp_path / "link"


@as_root
def test_another_users_home_or_link_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, OTHER, OTHER)
    with pytest.raises(PrivateFileError, match=r"belongs to another user \(uid 4321\)"):
        private_dir(theirs, "apportion home")
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    planted = tmp_path / "planted"
    planted.symlink_to(ours)
    os.chown(planted, OTHER, OTHER, follow_symlinks=False)
    with pytest.raises(PrivateFileError, match="is a symbolic link of another user"):
        private_dir(planted)


@as_root
def test_a_private_file_of_another_user_is_not_trusted(tmp_path: Path) -> None:
    planted = tmp_path / "scheduler.json"
    write_private(planted, "{}")
    os.chown(planted, OTHER, OTHER)
    with pytest.raises(PrivateFileError, match="belongs to another user"):
        read_private(planted, "scheduler file")


def test_a_private_file_replaces_a_link_planted_in_its_place(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    (tmp_path / "dir").mkdir()
    target = tmp_path / "dir" / "secret"
    target.symlink_to(victim)
    write_private(target, "s3cret\n")
    assert victim.read_text() == "untouched"
    assert not target.is_symlink() and target.read_text() == "s3cret\n"
    assert mode(target) == 0o600


def test_a_directory_the_user_named_is_taken_as_it_is(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)  # a team's directory for a scheduler file
    assert user_dir(shared) == shared and mode(shared) == 0o775
    assert mode(user_dir(tmp_path / "new" / "dir")) == 0o700


def test_the_journal_writes_no_log_lock_or_base_through_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    journal = Journal(tmp_path / "runs.db")
    try:
        journal.logs_dir.mkdir(mode=0o700)
        journal.log_path(1).symlink_to(victim)
        with pytest.raises(OSError):
            journal.append_log(1, b"output")
        journal.log_path(2).write_bytes(b"first attempt\n")
        journal.log_path(2).with_suffix(".base").symlink_to(victim)
        with pytest.raises(OSError):
            RunLogs(journal, None).new_attempt(2, 1)
    finally:
        journal.close()
    (tmp_path / "other.db.lock").symlink_to(victim)
    other = Journal(tmp_path / "other.db")
    try:
        with pytest.raises(OSError):
            other.claim("tcp://127.0.0.1:1")
    finally:
        other.close()
    assert victim.read_text() == "untouched"


def test_a_journals_log_directory_others_may_write_to_is_refused(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "runs.db")
    try:
        journal.logs_dir.mkdir()
        journal.logs_dir.chmod(0o777)
        with pytest.raises(PrivateFileError, match=r"run log directory .* writable by other"):
            journal.append_log(1, b"output")
    finally:
        journal.close()


# --- worker directories: a worker never purges what is not its own ------------------------


def _abandoned(path: Path) -> Path:
    """A worker directory whose worker is gone: its lock file exists, unlocked."""
    path.mkdir(mode=0o700)
    (path / LOCK).write_text("")
    return path


def test_a_link_named_like_a_worker_directory_is_not_followed(tmp_path: Path) -> None:
    elsewhere = _abandoned(tmp_path / "elsewhere")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / f"{PREFIX}planted").symlink_to(elsewhere)
    assert remove_stale(tmp_path / "base") == []
    assert (elsewhere / LOCK).exists()


@as_root
def test_another_users_abandoned_worker_directory_is_left_alone(tmp_path: Path) -> None:
    theirs = _abandoned(tmp_path / f"{PREFIX}theirs")
    os.chown(theirs, OTHER, OTHER)
    ours = _abandoned(tmp_path / f"{PREFIX}ours")
    fresh = LocalDirectory(tmp_path)
    try:
        assert theirs.exists() and not ours.exists()
    finally:
        fresh.remove()

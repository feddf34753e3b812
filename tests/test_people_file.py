"""The scheduler's people file: kept private, read back whole, a damaged one refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from apportion.core.people import new_person
from apportion.people_file import (
    PeopleFileError,
    people_path,
    read_people_file,
    write_people_file,
)


def test_the_people_and_their_secrets_come_back_as_they_were_kept(tmp_path: Path) -> None:
    path = people_path(tmp_path / "runs.db")
    assert path == tmp_path / "runs-people.json"
    assert read_people_file(path) == ([], {})  # none yet
    people = [new_person("alice", 2, "gpu=1"), new_person("bob")]
    write_people_file(path, people, {"alice": "a" * 64, "bob": "b" * 64})
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_people_file(path) == (people, {"alice": "a" * 64, "bob": "b" * 64})


def test_a_damaged_or_open_people_file_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "runs-people.json"
    write_people_file(path, [new_person("alice")], {"alice": "a" * 64})
    path.write_text('{"people": [{"name": "Alice", "secret": "x"}]}')
    with pytest.raises(PeopleFileError, match="is damaged: invalid person name 'Alice'"):
        read_people_file(path)
    path.chmod(0o644)
    with pytest.raises(PeopleFileError, match="open to other users"):
        read_people_file(path)

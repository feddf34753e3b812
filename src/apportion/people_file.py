"""The scheduler's people file: who the owner admitted, with each one's secret.

A scheduler that serves a run journal keeps its people beside it
(``runs-people.json`` beside ``runs.db``), so that the people, like the runs,
survive a restart of the scheduler. It holds secrets, so it is private to its owner
(0600, written atomically, refused if anyone else may read it: ``home.py``), like
the cluster's secret itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from apportion.core.people import Person, person_from_dict
from apportion.home import PrivateFileError, read_private, write_private


class PeopleFileError(OSError):
    """A people file that cannot be read or is not one (one line, naming the file)."""


def people_path(journal: Path) -> Path:
    """Where the scheduler serving ``journal`` keeps its people."""
    return journal.with_name(f"{journal.stem}-people.json")


def read_people_file(path: Path) -> tuple[list[Person], dict[str, str]]:
    """The people in ``path`` and their secrets; none if there is no file yet."""
    if not path.exists():
        return [], {}
    try:
        document: Any = json.loads(read_private(path, "people file"))
        rows = document["people"]
        people = [person_from_dict({k: v for k, v in row.items() if k != "secret"}) for row in rows]
        secrets = {str(row["name"]): str(row["secret"]) for row in rows}
    except PrivateFileError as exc:
        raise PeopleFileError(str(exc)) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PeopleFileError(f"people file {path} is damaged: {exc}") from None
    return people, secrets


def write_people_file(path: Path, people: list[Person], secrets: dict[str, str]) -> None:
    """Write ``people`` with their secrets to ``path`` (0600, atomically)."""
    rows = [{**person.to_dict(), "secret": secrets[person.name]} for person in people]
    write_private(path, json.dumps({"people": rows}, indent=2) + "\n")

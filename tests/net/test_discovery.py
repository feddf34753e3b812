"""Which scheduler is the user's own: pure, built from sightings, no files read."""

from __future__ import annotations

from pathlib import Path

import pytest

from apportion.net.discovery import (
    HOW_TO_START,
    Liveness,
    NoScheduler,
    Sighting,
    choose_own,
    dashboard_owner,
    running_elsewhere,
)
from apportion.net.scheduler_file import SchedulerFile

HOME = Path("/home/u/.apportion")
DEFAULT = HOME / "scheduler.json"
SPARE = HOME / "scheduler-8790.json"
FIRST = SchedulerFile("tcp://127.0.0.1:8786", "t", "s1", 11, dashboard="http://127.0.0.1:8787")
SECOND = SchedulerFile("tcp://127.0.0.1:8790", "t", "s2", 12, dashboard="http://127.0.0.1:40001")


def seen(path: Path, found: SchedulerFile | None, liveness: Liveness) -> Sighting:
    return Sighting(path, found, liveness)


@pytest.mark.parametrize("liveness", [Liveness.LIVE, Liveness.UNKNOWN])
def test_the_default_file_of_a_running_scheduler_is_chosen(liveness: Liveness) -> None:
    # UNKNOWN: a file written by something that takes no lock is taken at its word.
    assert choose_own(seen(DEFAULT, FIRST, liveness), [seen(SPARE, SECOND, Liveness.LIVE)]) == FIRST


def test_no_default_file_is_one_line_saying_how_to_start_one() -> None:
    with pytest.raises(NoScheduler) as info:
        choose_own(seen(DEFAULT, None, Liveness.UNKNOWN))
    text = str(info.value)
    assert text == (
        f"no scheduler of yours is running (no scheduler file at {DEFAULT}): {HOW_TO_START}"
    )
    assert "8786" not in text  # no fixed port is tried or suggested


def test_a_stale_default_file_is_said_to_be_left_by_a_scheduler_that_stopped() -> None:
    with pytest.raises(NoScheduler, match=r"left by one that stopped \(tcp://127.0.0.1:8786\)"):
        choose_own(seen(DEFAULT, FIRST, Liveness.STALE), [seen(SPARE, SECOND, Liveness.STALE)])


def test_with_no_default_another_running_scheduler_of_the_user_is_named() -> None:
    with pytest.raises(NoScheduler) as info:
        choose_own(seen(DEFAULT, None, Liveness.STALE), [seen(SPARE, SECOND, Liveness.LIVE)])
    assert str(info.value).endswith(
        f"yours at tcp://127.0.0.1:8790 is reached with --scheduler-file {SPARE}"
    )


def test_a_default_file_that_cannot_be_used_says_why() -> None:
    problem = f"scheduler file {DEFAULT} is open to other users (mode 0644): run `chmod 600`"
    with pytest.raises(NoScheduler, match="open to other users"):
        choose_own(Sighting(DEFAULT, None, Liveness.LIVE, problem))


def test_running_elsewhere_names_the_first_live_scheduler() -> None:
    sightings = [seen(DEFAULT, FIRST, Liveness.STALE), seen(SPARE, SECOND, Liveness.LIVE)]
    assert running_elsewhere(sightings) == (
        f"your scheduler at tcp://127.0.0.1:8790 is running (scheduler file {SPARE})"
    )
    assert running_elsewhere(sightings[:1]) is None


def test_a_dashboard_is_traced_to_its_scheduler_by_the_users_files() -> None:
    sightings = [seen(DEFAULT, FIRST, Liveness.LIVE), seen(SPARE, SECOND, Liveness.LIVE)]
    assert dashboard_owner("127.0.0.1:8787", sightings) == FIRST
    assert dashboard_owner("tcp://localhost:40001", sightings) == SECOND  # both loopback
    assert dashboard_owner("127.0.0.1:8786", sightings) is None
    assert dashboard_owner("10.0.0.1:8787", sightings) is None
    stale = [seen(DEFAULT, FIRST, Liveness.STALE)]
    assert dashboard_owner("127.0.0.1:8787", stale) is None  # its port may be anyone's now

"""The notebook card (dashboard/card.py): HTML from a snapshot, no sockets.

What Dask's tests read from its card holds here too (the scheduler's address, a
"Workers" line with the count on it, "Total threads: </strong>", memory in Dask's
two decimals, "No scheduler connected.", well-formed XML), and so does what is
apportion's own: each pool's free and total units over the cluster.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from apportion.core.sizes import format_bytes
from apportion.dashboard.card import WORKER_ROWS, CardFacts, format_amount, render, up_for

GiB = 2**30


def worker(
    name: str,
    nthreads: int = 1,
    resources: dict[str, float] | None = None,
    free: dict[str, float] | None = None,
    memory_limit: int = 2 * GiB,
    memory: int = 0,
) -> dict[str, Any]:
    """One worker as ``scheduler_info()`` gives it (the fields the card reads)."""
    return {
        "name": name,
        "nthreads": nthreads,
        "resources": resources or {},
        "free_resources": free if free is not None else dict(resources or {}),
        "memory_limit": memory_limit,
        "memory": memory,
        "status": "running",
        "pid": 100,
    }


def info(*workers: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "type": "Scheduler",
        "id": "scheduler-1",
        "address": "tcp://10.0.0.1:8786",
        "started": 1000.0,
        "workers": {f"tcp://10.0.0.{i + 2}:9000": w for i, w in enumerate(workers)},
        "tasks": {},
        "clients": 1,
        **extra,
    }


def facts(snapshot: dict[str, Any] | None, **changes: Any) -> CardFacts:
    values: dict[str, Any] = {
        "kind": "Client",
        "name": "client-1",
        "status": "connected",
        "address": "tcp://10.0.0.1:8786",
        "info": snapshot,
        "dashboard": "http://10.0.0.1:8787/login?token=T0K3N",
        "now": 1000.0 + 3725,
    }
    values.update(changes)
    return CardFacts(**values)


def text_of(card: str) -> str:
    """What a reader sees: the card's texts, one space between each."""
    return " ".join(" ".join(ET.fromstring(card).itertext()).split())


def test_the_card_names_the_scheduler_its_uptime_the_client_and_the_dashboard() -> None:
    card = render(facts(info(worker("a"), worker("b"))))
    seen = text_of(card)
    assert "apportion Client client-1 (connected)" in seen
    assert "Scheduler tcp://10.0.0.1:8786" in seen
    assert "Up for 1 h 2 min" in seen
    link = ET.fromstring(card).find(".//a[@class='dashboard']")
    assert link is not None
    assert link.get("href") == "http://10.0.0.1:8787/login?token=T0K3N"
    assert link.text == "http://10.0.0.1:8787/"  # the token is in the link, not its text


def test_the_workers_line_counts_workers_threads_and_memory_as_dask_writes_them() -> None:
    workers = [worker(f"w{i}", nthreads=2, memory=GiB // 2) for i in range(6)]
    card = render(facts(info(*workers)))
    line = re.search("(Workers.+)", card)  # Dask's own tests read the count this way
    assert line is not None and re.match("Workers.*6", line.group(1))
    assert "Total threads: </strong>12" in card
    assert "12.00 GiB" in card and "3.00 GiB in use" in text_of(card)


def test_workers_without_a_memory_limit_say_so() -> None:
    card = render(facts(info(worker("a", memory_limit=0))))
    assert "Total memory: no limit" in text_of(card)


def test_each_pool_shows_its_free_and_total_units_over_the_cluster() -> None:
    card = render(
        facts(
            info(
                worker("a", resources={"GPU": 2, "licence": 1}, free={"GPU": 1, "licence": 1}),
                worker("b", resources={"GPU": 2}, free={"GPU": 0.5}),
            )
        )
    )
    root = ET.fromstring(card)
    rows = {
        row.get("data-pool"): [cell.text for cell in row.findall("td")]
        for row in root.iterfind(".//table[@class='pools']/tr[@data-pool]")
    }
    assert rows == {"GPU": ["GPU", "1.5", "4", "2"], "licence": ["licence", "1", "1", "1"]}
    assert "GPU 1/2, licence 1/1" in text_of(card)  # and each worker's own


def test_a_cluster_without_pools_says_so() -> None:
    assert "Resource pools: none" in text_of(render(facts(info(worker("a")))))


def test_task_counts_by_state() -> None:
    card = render(facts(info(worker("a"), tasks={"memory": 3, "processing": 1})))
    assert "Tasks: 3 memory, 1 processing" in text_of(card)


def test_workers_are_listed_by_name_as_people_count_and_the_rest_counted() -> None:
    many = [worker(f"worker-{i}") for i in range(WORKER_ROWS + 3)][::-1]
    root = ET.fromstring(render(facts(info(*many))))
    rows = root.iterfind(".//table[@class='worker-list']/tr")
    names = [cells[0].text for row in rows if (cells := row.findall("td"))]
    assert names == [f"worker-{i}" for i in range(WORKER_ROWS)] + ["and 3 more"]


def test_no_dashboard_is_said_in_words() -> None:
    card = render(facts(info(worker("a")), dashboard=None))
    assert "Dashboard none: this scheduler serves no dashboard" in text_of(card)
    assert "<a " not in card


def test_a_dashboard_served_but_not_linked_from_here_is_named_without_a_link() -> None:
    served = info(worker("a"), dashboard="http://10.0.0.1:8787/")
    card = render(facts(served, dashboard=None, status="lost the scheduler"))
    assert "Dashboard http://10.0.0.1:8787/ (no login link: lost the scheduler)" in text_of(card)
    assert "<a " not in card


@pytest.mark.parametrize("status", ["closed", "not connected yet"])
def test_without_a_scheduler_the_card_says_so_and_why(status: str) -> None:
    card = render(facts(None, status=status, dashboard=None))
    seen = text_of(card)
    assert "No scheduler connected." in seen and f"({status})" in seen
    assert "tcp://10.0.0.1:8786" in seen  # the address it had, or will have


def test_an_old_picture_is_marked_as_such() -> None:
    card = render(facts(info(worker("a")), note="as last fetched"))
    assert "as last fetched" in text_of(card)


def test_every_value_is_escaped() -> None:
    hostile = '<script>alert("x")</script>&'
    card = render(
        facts(
            info(worker(hostile, resources={hostile: 1})),
            name=hostile,
            dashboard='http://h/login?token="><b>',
        )
    )
    root = ET.fromstring(card)  # still well-formed: nothing broke out
    assert root.find(".//script") is None and root.find(".//b") is None
    assert text_of(card).count(hostile) == 4  # title, pool, worker name, worker's pools
    link = root.find(".//a")
    assert link is not None and link.get("href") == 'http://h/login?token="><b>'


def test_durations_and_amounts_read_as_people_write_them() -> None:
    assert [up_for(s) for s in (-1, 42, 600, 3725, 2 * 86400 + 7200)] == [
        "0 s",
        "42 s",
        "10 min",
        "1 h 2 min",
        "2 d 2 h",
    ]
    assert [format_amount(x) for x in (2.0, 0.5, 1e11, 1.0 / 3)] == [
        "2",
        "0.5",
        "100000000000",
        "0.333333",
    ]
    assert format_bytes(3 * GiB, digits=2) == "3.00 GiB" and format_bytes(3 * GiB) == "3.0 GiB"

"""Following runs from the command line: a progress line until every run finished.

Shared by ``apportion submit --wait`` and ``apportion runs --scheduler --watch``.
"""

from __future__ import annotations

import sys
import time
from collections import Counter

import click

from apportion.runs import remote
from apportion.runs.journal import COMPLETED, FINISHED, STATES, RunRecord
from apportion.runs.table import progress_line, summary

#: Seconds between progress queries.
WAIT_INTERVAL = 0.5


def follow(address: str, ids: list[int]) -> int:
    """Show a progress line until every run finished; 0 if all completed, else 1."""
    tty = sys.stdout.isatty()
    last = ""
    while True:
        try:
            records = remote.query(address, ids)
        except remote.RemoteQueueError as error:
            click.echo(f"\nError: {error}", err=True)
            return 1
        counts = _counts(records)
        line = progress_line(counts)
        if line != last:
            click.echo(("\r" + line) if tty else line, nl=not tty)
            last = line
        if sum(counts[state] for state in FINISHED) >= len(ids):
            break
        time.sleep(WAIT_INTERVAL)
    if tty:
        click.echo()
    click.echo(summary(counts))
    for record in records:
        if record.state != COMPLETED:
            click.echo(f"run {record.label()}: {record.state}: {record.reason}")
    return 0 if counts[COMPLETED] == len(ids) else 1


def _counts(records: list[RunRecord]) -> Counter[str]:
    counts: Counter[str] = Counter(dict.fromkeys(STATES, 0))
    counts.update(record.state for record in records)
    return counts

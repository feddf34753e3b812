"""Suggestions ("did you mean GPU?") for a resource name that no worker offers.

A request for ``gpu`` where every worker offers ``GPU``, or for ``GUP``, can never be
met, and nothing about it looks wrong until the user wonders why it never starts.
The scheduler (Python tasks) and the job queue (``apportion submit --resources``)
both ask here whether a name they cannot place is a slip of the keyboard, so that
both say the same thing about the same mistake.

Two strengths, because they lead to different things:

- A *slip* (``slip_of``, ``misspelt``) fails a task or refuses a run at once, on
  any cluster, so it must be near certain: the names differ only in case, or by
  two neighbouring letters swapped, or by one letter missing or added (``gpu``,
  ``GUP``, ``GPUS`` for ``GPU``; ``licnce`` for ``licence``). A letter replaced by
  another is not a slip: ``cpus`` beside ``gpus``, or ``cpu`` beside ``GPU``, are as
  likely two real pools, one of which has no worker yet.
- A *suggestion* (``suggest``, ``suggestions``) only adds "did you mean ...?" to a
  warning or an explanation: any name ``difflib`` finds close (``mem`` for
  ``MEMORY``, ``cpus`` for ``gpus``).

Names whose numbers differ are never slips of each other, nor suggested for each
other: ``gpu1`` beside an offered ``gpu0``, or ``licence2`` beside ``licence1``, are
more likely two real pools.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping

#: How alike two names must be (``difflib``'s ratio) for one to be suggested for the
#: other: ``MEM`` for ``MEMORY`` is 0.67.
CUTOFF = 0.6

_NUMBERS = re.compile(r"\d+")


def slip_of(name: str, offered: Iterable[str]) -> str | None:
    """The offered name that ``name`` is a slip of (see above); None if ``name`` is
    offered itself or is no slip of any."""
    names = sorted(set(offered))
    if name in names:
        return None
    folded = name.casefold()
    for candidate in names:
        if candidate.casefold() == folded:
            return candidate
    numbers = _NUMBERS.findall(name)
    for candidate in names:
        if _NUMBERS.findall(candidate) == numbers and _one_slip(folded, candidate.casefold()):
            return candidate
    return None


def suggest(name: str, offered: Iterable[str]) -> str | None:
    """An offered name ``name`` may have been meant as: a slip, or else the closest
    name ``difflib`` finds; None if ``name`` is offered or none is close enough."""
    names = sorted(set(offered))
    slip = slip_of(name, names)
    if slip is not None or name in names:
        return slip
    numbers = _NUMBERS.findall(name)
    by_folded = {c.casefold(): c for c in names if _NUMBERS.findall(c) == numbers}
    close = difflib.get_close_matches(name.casefold(), list(by_folded), n=1, cutoff=CUTOFF)
    return by_folded[close[0]] if close else None


def misspelt(asked: Iterable[str], offered: Iterable[str]) -> dict[str, str]:
    """Each name of ``asked`` that is not offered but is a slip of one that is: the
    offered name."""
    return _each(asked, offered, slip_of)


def suggestions(asked: Iterable[str], offered: Iterable[str]) -> dict[str, str]:
    """Each name of ``asked`` that is not offered, with its suggestion, if it has one."""
    return _each(asked, offered, suggest)


def _each(
    asked: Iterable[str],
    offered: Iterable[str],
    find: Callable[[str, Iterable[str]], str | None],
) -> dict[str, str]:
    """``find(name, offered)`` for each distinct name of ``asked``, where it found one."""
    pool = set(offered)
    found = {}
    for name in sorted(set(asked)):
        match = find(name, pool)
        if match is not None:
            found[name] = match
    return found


def did_you_mean(meant: Mapping[str, str]) -> str:
    """``{"gpu": "GPU"}`` -> ``"did you mean GPU (not gpu)?"``; "" for none."""
    if not meant:
        return ""
    return "did you mean " + " and ".join(f"{v} (not {k})" for k, v in meant.items()) + "?"


def _one_slip(a: str, b: str) -> bool:
    """``a`` and ``b`` (different) differ by two neighbouring letters swapped, or by
    one letter missing from the longer (of at least three)."""
    if len(a) == len(b):
        diffs = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        return (
            len(diffs) == 2
            and diffs[1] == diffs[0] + 1
            and a[diffs[0]] == b[diffs[1]]
            and a[diffs[1]] == b[diffs[0]]
        )
    short, long = sorted((a, b), key=len)
    if len(long) - len(short) != 1 or len(long) < 3:
        return False
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))

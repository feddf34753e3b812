"""Suggestions ("did you mean GPU?") for a resource name that no worker offers.

A request for ``gpu`` where every worker offers ``GPU``, or for ``GUP``, can never be
met, and nothing about it looks wrong until the user wonders why it never starts.
The scheduler (Python tasks) and the job queue (``apportion submit --resources``)
both ask here whether a name they cannot place is a slip of the keyboard, so that
both say the same thing about the same mistake.

A name is taken for a slip of another when it differs only in case, or when
``difflib`` finds it close (a letter missing, added, swapped or mistyped). Names
whose numbers differ are never slips of each other: ``gpu1`` beside an offered
``gpu0``, or ``licence2`` beside ``licence1``, are more likely two real pools, one of
which has no worker yet.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

#: How alike two names must be (``difflib``'s ratio) for one to be suggested for the
#: other: ``GUP`` for ``GPU`` is 0.67, ``MEM`` for ``MEMORY`` 0.67.
CUTOFF = 0.6

_NUMBERS = re.compile(r"\d+")


def suggest(name: str, offered: Iterable[str]) -> str | None:
    """The offered name ``name`` is probably a slip of; None if it is offered or none is
    close enough."""
    names = sorted(set(offered))
    if name in names:
        return None
    folded = name.casefold()
    for candidate in names:
        if candidate.casefold() == folded:
            return candidate
    numbers = _NUMBERS.findall(name)
    by_folded = {c.casefold(): c for c in names if _NUMBERS.findall(c) == numbers}
    close = difflib.get_close_matches(folded, list(by_folded), n=1, cutoff=CUTOFF)
    return by_folded[close[0]] if close else None


def misspelt(asked: Iterable[str], offered: Iterable[str]) -> dict[str, str]:
    """Each name of ``asked`` that is not offered but is a slip of one that is: its
    suggestion."""
    pool = set(offered)
    found = {}
    for name in sorted(set(asked)):
        guess = suggest(name, pool)
        if guess is not None:
            found[name] = guess
    return found


def did_you_mean(slips: Mapping[str, str]) -> str:
    """``{"gpu": "GPU"}`` -> ``"did you mean GPU (not gpu)?"``; "" for none."""
    if not slips:
        return ""
    return "did you mean " + " and ".join(f"{v} (not {k})" for k, v in slips.items()) + "?"

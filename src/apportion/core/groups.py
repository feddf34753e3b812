"""Task groups: the name a task's key shares with its siblings.

Dask names keys ``"inc-3f2a..."`` or ``('sum-aggregate-9c1d...', 0)``; the group is
the name without its hash or index (``inc``, ``sum-aggregate``). Progress bars, the
dashboard's colours and the metrics' labels all count by it.
"""

from __future__ import annotations

import re

_HASHLIKE = re.compile(r"^[0-9a-f]{8,}$")


def group_of(key: str) -> str:
    """The task group a key belongs to: ``"inc-3f2a..."`` -> ``"inc"``,
    ``"('sum-aggregate-9c1d...', 0)"`` -> ``"sum-aggregate"``."""
    text = key
    if text.startswith("("):  # a Dask tuple key, sent as its repr
        text = text[1:].split(",", 1)[0].strip("'\" ")
    words = text.split("-")
    kept = [words[0]]
    for word in words[1:]:
        if not word.isalpha() or _HASHLIKE.match(word):
            break
        kept.append(word)
    return "-".join(kept) or "other"

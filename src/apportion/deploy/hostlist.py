"""Host lists as Slurm writes them (``node[01-04]``, ``gpu[1,3-5],cpu7``) and hostfiles.

Expansion follows Slurm's ``scontrol show hostnames``: commas outside brackets
separate entries; a bracket group holds numbers and ranges (``3-5``); a range keeps
the zero padding of its first bound (``[08-10]`` gives ``08 09 10``); several groups
in one entry multiply out, the leftmost varying slowest (``rack[1-2]-n[1-2]`` gives
``rack1-n1 rack1-n2 rack2-n1 rack2-n2``). An IP address is an entry like any other
name (it has no brackets to expand), and ``[::1]``-style IPv6 literals are kept whole.

Duplicates are kept, in order: a host named twice is meant twice. ``apportion ssh``
reads the first host as the scheduler's and the rest as workers', so ``localhost
localhost`` is a scheduler and a worker on one machine, as with ``dask-ssh``.

Pure: text in, lists out; errors are ``ValueError`` quoting the text at fault.
"""

from __future__ import annotations

import ipaddress
import itertools
import math
import re
from collections.abc import Iterable

#: More hosts than this from one text is a typo (``node[1-1000000]``), not a cluster.
MAX_HOSTS = 100_000

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_NUMBERED = re.compile(r"(.*?)(\d+)")


def expand_nodelist(text: str) -> list[str]:
    """Every host ``text`` names, in order, duplicates kept (module docstring)."""
    hosts: list[str] = []
    for entry in _split_top_level(text.strip(), text):
        hosts.extend(_expand_entry(entry, text))
        if len(hosts) > MAX_HOSTS:
            raise ValueError(f"host list {text!r} names more than {MAX_HOSTS} hosts")
    if not hosts:
        raise ValueError(f"host list {text!r} names no host")
    return hosts


def read_hostfile(text: str, source: str = "hostfile") -> list[str]:
    """The hosts of a hostfile's ``text``: one entry per line, each a host or a node
    list; ``#`` starts a comment; blank lines are skipped; duplicates are kept."""
    hosts: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if any(c.isspace() for c in line):
            raise ValueError(
                f"{source} line {number}: {raw.strip()!r} holds more than one word; "
                "give one host or node list per line (no `slots=` or other settings)"
            )
        try:
            hosts.extend(expand_nodelist(line))
        except ValueError as exc:
            raise ValueError(f"{source} line {number}: {exc}") from None
    if not hosts:
        raise ValueError(f"{source} names no host")
    return hosts


def compress_hosts(hosts: Iterable[str]) -> str:
    """A node list that expands to ``hosts`` (same order, duplicates kept): runs of
    neighbours sharing a prefix and a number width become one bracket group."""
    groups: list[tuple[str, int, list[int]]] = []  # prefix, width, numbers
    plain: list[str | int] = []  # a host, or the index of its group
    for host in hosts:
        found = _NUMBERED.fullmatch(host)
        if found is None or "[" in host or "," in host or _is_ip(host):
            plain.append(host)
            continue
        prefix, digits = found.groups()
        number, width = int(digits), len(digits)
        last = plain[-1] if plain else None
        if isinstance(last, int):
            previous_prefix, previous_width, numbers = groups[last]
            if previous_prefix == prefix and previous_width == width and numbers[-1] < number:
                numbers.append(number)
                continue
        groups.append((prefix, width, [number]))
        plain.append(len(groups) - 1)
    return ",".join(item if isinstance(item, str) else _group_text(*groups[item]) for item in plain)


def _group_text(prefix: str, width: int, numbers: list[int]) -> str:
    if len(numbers) == 1:
        return f"{prefix}{numbers[0]:0{width}d}"
    ranges: list[str] = []
    start = previous = numbers[0]
    for number in [*numbers[1:], None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        bound = f"{start:0{width}d}"
        ranges.append(bound if start == previous else f"{bound}-{previous:0{width}d}")
        if number is not None:
            start = previous = number
    return f"{prefix}[{','.join(ranges)}]"


def _split_top_level(text: str, whole: str) -> list[str]:
    """``text`` cut at the commas outside brackets."""
    entries: list[str] = []
    depth, start = 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in host list {whole!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unmatched ']' in host list {whole!r}")
        elif char == "," and depth == 0:
            entries.append(text[start:index])
            start = index + 1
    if depth:
        raise ValueError(f"unmatched '[' in host list {whole!r}")
    entries.append(text[start:])
    for entry in entries:
        if not entry.strip():
            raise ValueError(f"empty entry in host list {whole!r}")
    return [entry.strip() for entry in entries]


def _expand_entry(entry: str, whole: str) -> list[str]:
    """The hosts of one entry: literal parts and bracket groups, multiplied out."""
    if _is_bracketed_ip(entry):
        return [entry]
    parts: list[list[str]] = []
    for piece in re.finditer(r"\[([^\]]*)\]|[^\[]+", entry):
        group = piece.group(1)
        parts.append([piece.group(0)] if group is None else _expand_group(group, entry, whole))
    if math.prod(len(part) for part in parts) > MAX_HOSTS:
        raise ValueError(f"host list {whole!r} names more than {MAX_HOSTS} hosts")
    return ["".join(combination) for combination in itertools.product(*parts)]


def _expand_group(group: str, entry: str, whole: str) -> list[str]:
    """The numbers of one bracket group, as text with their padding."""
    numbers: list[str] = []
    for item in group.split(","):
        found = _RANGE.fullmatch(item.strip())
        if found is None:
            raise ValueError(
                f"bad range {item.strip()!r} in {entry!r} of host list {whole!r}: "
                "give numbers and ranges, as in node[01-04,07]"
            )
        first, last = found.group(1), found.group(2)
        if last is None:
            numbers.append(first)
            continue
        if int(last) < int(first):
            raise ValueError(f"range {item.strip()!r} in host list {whole!r} runs backwards")
        if int(last) - int(first) >= MAX_HOSTS:
            raise ValueError(f"host list {whole!r} names more than {MAX_HOSTS} hosts")
        width = len(first)
        numbers.extend(f"{n:0{width}d}" for n in range(int(first), int(last) + 1))
    return numbers


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _is_bracketed_ip(entry: str) -> bool:
    """``[::1]``, ``user@[fe80::1]``: an IPv6 literal, not a bracket group."""
    found = re.fullmatch(r"(?:[^@\[\]]+@)?\[([^\]]*)\]", entry)
    return found is not None and ":" in found.group(1) and _is_ip(found.group(1))

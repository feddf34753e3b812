"""Per-process shares for ``apportion worker --nworkers N --split-units``.

As in Dask, a supply applies to *each* worker process. That is right for amounts
(``process=1``: one task at a time in every process) but wrong for devices: four
processes all offering ``gpu=[0-3]`` would hand the same GPU to four tasks. With
``--split-units`` every indexed pool is dealt out in label order, each process
getting a contiguous, distinct share; amount pools are left whole.
"""

from __future__ import annotations

from apportion.core.resources import SCALE, format_resources, parse_supply


def split_labels(labels: list[str], parts: int, *, name: str = "?") -> list[list[str]]:
    """``labels`` cut into ``parts`` contiguous shares, the larger ones first.

    ``[0,1,2,3,4]`` in 2 is ``[0,1,2]`` and ``[3,4]``. Fewer labels than parts
    raises ``ValueError``: a process with an empty share would not have the pool.
    """
    if len(labels) < parts:
        raise ValueError(
            f"pool {name!r} has {len(labels)} units, fewer than the {parts} worker processes"
        )
    size, extra = divmod(len(labels), parts)
    shares: list[list[str]] = []
    start = 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        shares.append(labels[start:end])
        start = end
    return shares


def split_supply(spec: str, parts: int) -> list[str]:
    """One spec per worker process: indexed pools split, amount pools repeated.

    >>> split_supply("gpu=[0-3] licence=1", 2)
    ['gpu=[0,1] licence=1', 'gpu=[2,3] licence=1']
    """
    amounts, units = parse_supply(spec)
    split = {name: split_labels(labels, parts, name=name) for name, labels in units.items()}
    specs = []
    for i in range(parts):
        share = {name: shares[i] for name, shares in split.items()}
        share_amounts = {**amounts, **{name: len(u) * SCALE for name, u in share.items()}}
        specs.append(format_resources(share_amounts, share))
    return specs

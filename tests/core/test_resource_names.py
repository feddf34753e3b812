"""Which unknown resource names are taken for slips of offered ones, and what is
suggested for the others."""

from __future__ import annotations

import pytest

from apportion.core.resource_names import (
    did_you_mean,
    misspelt,
    slip_of,
    suggest,
    suggestions,
)

OFFERED = ["GPU", "MEMORY", "licence", "gpu0", "gpus"]


@pytest.mark.parametrize(
    ("asked", "slip", "suggested"),
    [
        ("gpu", "GPU", "GPU"),  # case only
        ("Gpu", "GPU", "GPU"),
        ("GUP", "GPU", "GPU"),  # two neighbours swapped
        ("PGU", "GPU", "GPU"),
        ("GPUSS", "gpus", "gpus"),  # one letter added
        ("licnce", "licence", "licence"),  # one missing
        ("lciense", None, "licence"),  # further off: only a suggestion
        ("mem", None, "MEMORY"),
        ("cpus", None, "gpus"),  # another letter: maybe another pool, not a slip
        ("cpu", None, "GPU"),
        ("GPU", None, None),  # offered
        ("foo", None, None),  # nothing alike
        ("gpu1", None, None),  # another number: another pool
        ("licence2", None, None),
    ],
)
def test_slips_and_suggestions(asked: str, slip: str | None, suggested: str | None) -> None:
    assert slip_of(asked, OFFERED) == slip
    assert suggest(asked, OFFERED) == suggested


def test_short_names_are_not_slips_by_a_letter() -> None:
    assert slip_of("ab", ["a"]) is None
    assert slip_of("ba", ["ab"]) == "ab"


def test_nothing_offered() -> None:
    assert slip_of("GPU", []) is None
    assert suggest("GPU", []) is None


def test_misspelt_keeps_only_slips_and_suggestions_any_close_name() -> None:
    asked = ["gpu", "licence", "nothing-like-it", "mem"]
    assert misspelt(asked, OFFERED) == {"gpu": "GPU"}
    assert suggestions(asked, OFFERED) == {"gpu": "GPU", "mem": "MEMORY"}


def test_did_you_mean() -> None:
    assert did_you_mean({}) == ""
    assert did_you_mean({"gpu": "GPU"}) == "did you mean GPU (not gpu)?"
    assert did_you_mean({"gpu": "GPU", "mem": "MEMORY"}) == (
        "did you mean GPU (not gpu) and MEMORY (not mem)?"
    )

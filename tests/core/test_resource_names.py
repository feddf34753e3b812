"""Which unknown resource names are taken for slips of offered ones."""

from __future__ import annotations

import pytest

from apportion.core.resource_names import did_you_mean, misspelt, suggest

OFFERED = ["GPU", "MEMORY", "licence", "gpu0"]


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        ("gpu", "GPU"),  # case only
        ("Gpu", "GPU"),
        ("GUP", "GPU"),  # two letters swapped
        ("GPUS", "GPU"),  # one added
        ("mem", "MEMORY"),
        ("licnce", "licence"),  # one missing
        ("GPU", None),  # offered
        ("foo", None),  # nothing alike
        ("gpu1", None),  # another number: another pool, not a slip
        ("licence2", None),
    ],
)
def test_suggest(asked: str, expected: str | None) -> None:
    assert suggest(asked, OFFERED) == expected


def test_suggest_with_nothing_offered() -> None:
    assert suggest("GPU", []) is None


def test_misspelt_keeps_only_names_with_a_suggestion() -> None:
    assert misspelt(["gpu", "licence", "nothing-like-it", "mem"], OFFERED) == {
        "gpu": "GPU",
        "mem": "MEMORY",
    }


def test_did_you_mean() -> None:
    assert did_you_mean({}) == ""
    assert did_you_mean({"gpu": "GPU"}) == "did you mean GPU (not gpu)?"
    assert did_you_mean({"gpu": "GPU", "mem": "MEMORY"}) == (
        "did you mean GPU (not gpu) and MEMORY (not mem)?"
    )

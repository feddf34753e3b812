"""People's names, weights and quotas, and the token a person connects with: pure."""

from __future__ import annotations

import pytest

from apportion.core.people import Person, new_person, person_from_dict
from apportion.core.resources import SCALE
from apportion.net.person_token import person_token, split_token
from apportion.net.security import Security


def test_a_person_is_checked_and_keeps_their_quota_in_ticks() -> None:
    alice = new_person("alice", "2", "gpu=2 memory=1GiB")
    assert alice == Person("alice", 2.0, {"gpu": 2 * SCALE, "memory": (1 << 30) * SCALE})
    assert person_from_dict(alice.to_dict()) == alice
    assert new_person("bob").quota == {} and new_person("bob").weight == 1.0


@pytest.mark.parametrize(
    ("name", "weight", "quota", "said"),
    [
        ("Alice", 1, "", "invalid person name 'Alice'"),
        ("", 1, "", "invalid person name ''"),
        ("a b", 1, "", "invalid person name 'a b'"),
        ("x" * 65, 1, "", "invalid person name"),
        ("alice", 0, "", "invalid weight 0: give a number above 0"),
        ("alice", -1, "", "invalid weight -1"),
        ("alice", "inf", "", "invalid weight 'inf'"),
        ("alice", "heavy", "", "invalid weight 'heavy'"),
        ("alice", 1, "gpu=x", "invalid quota 'gpu=x': resource 'gpu': amount 'x'"),
        ("alice", 1, "gpu", "invalid quota 'gpu': invalid resource spec"),
        ("alice", 1, "gpu=[0,1]", "invalid quota 'gpu=[0,1]'"),
    ],
)
def test_bad_people_are_refused_in_one_line(
    name: str, weight: object, quota: str, said: str
) -> None:
    with pytest.raises(ValueError) as caught:
        new_person(name, weight, quota)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_person_token_names_its_person_and_proves_its_own_secret() -> None:
    token = person_token("alice", "s" * 64)
    assert split_token(token) == ("alice", "s" * 64)
    assert split_token("ab" * 32) == ("", "ab" * 32)  # the cluster's secret: the owner
    security = Security(token=token)
    assert security.person == "alice" and security.key() == b"s" * 64
    assert Security(token="ab" * 32).person == ""
    with pytest.raises(ValueError, match="person:NAME:SECRET"):
        split_token("person:alice")


def test_a_quota_of_zero_is_kept_and_survives_the_round_trip() -> None:
    # A request of 0 asks for nothing; a cap of 0 allows nothing.
    alice = new_person("alice", 1, "gpu=0 threads=2")
    assert alice.quota == {"gpu": 0, "threads": 20_000}
    assert person_from_dict(alice.to_dict()) == alice and alice.quota_text == "gpu=0 threads=2"

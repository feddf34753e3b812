"""Reading a Slurm grant from a job's environment (``--resources slurm``): pure, no Slurm."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.core.resources import SCALE, parse_supply
from apportion.deploy.slurm_env import (
    SLURM,
    NotInAllocation,
    SlurmGrant,
    grant_supply,
    in_allocation,
    slurm_grant,
)
from apportion.worker.detect import expand_auto

JOB = {"SLURM_JOB_ID": "17", "SLURM_CPUS_ON_NODE": "4"}


def test_outside_an_allocation_is_refused_with_the_reason() -> None:
    assert not in_allocation({"SLURM_CPUS_ON_NODE": "4"})
    with pytest.raises(NotInAllocation, match="SLURM_JOB_ID is not set"):
        slurm_grant({"SLURM_CPUS_ON_NODE": "4"})


def test_cpus_alone() -> None:
    assert slurm_grant(JOB) == SlurmGrant(cpus=4, memory=None, gpus=())


def test_memory_per_node_wins_over_memory_per_cpu() -> None:
    env = {**JOB, "SLURM_MEM_PER_NODE": "1024", "SLURM_MEM_PER_CPU": "1"}
    assert slurm_grant(env).memory == 2**30


@pytest.mark.parametrize(("text", "mib"), [("512", 512), ("512M", 512), ("2G", 2048)])
def test_memory_per_cpu_is_multiplied_by_the_cpus(text: str, mib: int) -> None:
    assert slurm_grant({**JOB, "SLURM_MEM_PER_CPU": text}).memory == 4 * mib * 2**20


def test_gpus_come_from_the_mask_slurm_set_first() -> None:
    env = {**JOB, "CUDA_VISIBLE_DEVICES": "2,3", "SLURM_JOB_GPUS": "0,1,2,3"}
    assert slurm_grant(env).gpus == ("2", "3")
    assert slurm_grant({**JOB, "SLURM_STEP_GPUS": "1", "SLURM_JOB_GPUS": "0,1"}).gpus == ("1",)
    assert slurm_grant({**JOB, "SLURM_JOB_GPUS": "0,5"}).gpus == ("0", "5")
    assert slurm_grant({**JOB, "SLURM_JOB_GPUS": "N/A"}).gpus == ()
    assert slurm_grant({**JOB, "CUDA_VISIBLE_DEVICES": ""}).gpus == ()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"SLURM_CPUS_ON_NODE": "0"}, "SLURM_CPUS_ON_NODE='0'"),
        ({"SLURM_CPUS_ON_NODE": "2(x3)"}, "positive whole number"),
        ({"SLURM_MEM_PER_NODE": "lots"}, "SLURM_MEM_PER_NODE='lots'"),
        ({"SLURM_MEM_PER_CPU": "-5"}, "size in MiB"),
        ({"CUDA_VISIBLE_DEVICES": "0,0"}, "listed twice"),
        ({"SLURM_JOB_GPUS": "gpu0"}, "SLURM_JOB_GPUS='gpu0'"),
    ],
)
def test_malformed_values_name_their_variable(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        slurm_grant({**JOB, **extra})


def test_missing_cpus_is_an_error() -> None:
    with pytest.raises(ValueError, match="SLURM_CPUS_ON_NODE is not set"):
        slurm_grant({"SLURM_JOB_ID": "1"})


def test_the_word_expands_like_auto_and_written_pools_win() -> None:
    env = {**JOB, "SLURM_MEM_PER_NODE": "1024", "CUDA_VISIBLE_DEVICES": "1,3"}
    supply = grant_supply(slurm_grant(env))
    assert expand_auto(SLURM, supply, SLURM) == "cpus=4 gpu=[1,3] memory=1073741824"
    assert expand_auto("slurm licence=2 cpus=1", supply, SLURM) == (
        "cpus=1 gpu=[1,3] licence=2 memory=1073741824"
    )


@given(
    cpus=st.integers(1, 512),
    mib=st.none() | st.integers(1, 2**22),
    gpus=st.lists(st.integers(0, 63), unique=True, max_size=16),
)
def test_any_grant_becomes_a_spec_the_worker_parses_back(
    cpus: int, mib: int | None, gpus: list[int]
) -> None:
    env = {"SLURM_JOB_ID": "9", "SLURM_CPUS_ON_NODE": str(cpus)}
    if mib is not None:
        env["SLURM_MEM_PER_NODE"] = str(mib)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    amounts, units = parse_supply(expand_auto(SLURM, grant_supply(slurm_grant(env)), SLURM))
    assert amounts["cpus"] == cpus * SCALE
    assert amounts.get("memory") == (None if mib is None else mib * 2**20 * SCALE)
    # The pool is exactly the mask: a task's CUDA_VISIBLE_DEVICES is a subset of it.
    assert units.get("gpu", []) == [str(g) for g in gpus]


@given(st.text(max_size=12))
def test_any_cpu_text_is_parsed_or_refused_with_a_value_error(text: str) -> None:
    try:
        grant = slurm_grant({"SLURM_JOB_ID": "1", "SLURM_CPUS_ON_NODE": text})
    except ValueError:
        return
    assert grant.cpus >= 1

"""``--resources auto`` and ``--split-units``: pure parsing, then probes with a fake nvidia-smi."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from apportion.cli.inspect import format_unit_states
from apportion.core.resources import SCALE, parse_supply
from apportion.worker import detect
from apportion.worker.detect import (
    Gpu,
    detected_supply,
    expand_auto,
    gpu_labels,
    parse_mask,
    parse_nvidia_smi,
    probe_gpus,
    split_auto,
)
from apportion.worker.shares import split_labels, split_supply

FOUR_GPUS = (
    "0, GPU-8f6c1a2b-0000-0000-0000-000000000000\n"
    "1, GPU-8f6c1a2b-1111-1111-1111-111111111111\n"
    "2, GPU-2222aaaa-2222-2222-2222-222222222222\n"
    "3, GPU-3333bbbb-3333-3333-3333-333333333333\n"
)
UUID2 = "GPU-2222aaaa-2222-2222-2222-222222222222"


# --- nvidia-smi output --------------------------------------------------------------


def test_nvidia_smi_lines_give_index_and_uuid() -> None:
    gpus = parse_nvidia_smi(FOUR_GPUS)
    assert [g.index for g in gpus] == ["0", "1", "2", "3"]
    assert gpus[2] == Gpu("2", UUID2)


@pytest.mark.parametrize("output", ["", "\n", "  \n\n"])
def test_empty_nvidia_smi_output_is_no_gpus(output: str) -> None:
    assert parse_nvidia_smi(output) == []


@pytest.mark.parametrize(
    "output",
    [
        "No devices were found",
        "0, GPU-aaa, extra",
        "zero, GPU-aaa",
        "0 GPU-aaa",
        "0, not-a-uuid",
        "0, GPU-aaa\nNVIDIA-SMI has failed because it couldn't communicate with the driver",
    ],
)
def test_garbage_nvidia_smi_output_is_refused_whole(output: str) -> None:
    with pytest.raises(ValueError, match="unexpected line"):
        parse_nvidia_smi(output)


# --- CUDA_VISIBLE_DEVICES -----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "entries"),
    [
        (None, None),
        ("", []),
        ("  ", []),
        ("-1", []),
        ("2,3", ["2", "3"]),
        (" 3 , 1 ", ["3", "1"]),
        ("0,-1,2", ["0"]),  # CUDA ignores everything after an invalid index
        (UUID2, [UUID2]),
        (f"1,{UUID2}", ["1", UUID2]),
        ("MIG-5c2a7e34-1111-2222-3333-444444444444", ["MIG-5c2a7e34-1111-2222-3333-444444444444"]),
    ],
)
def test_mask_entries(value: str | None, entries: list[str] | None) -> None:
    assert parse_mask(value) == entries


@pytest.mark.parametrize("value", ["0,0", "gpu0", "0,,1", "0;1"])
def test_malformed_masks_are_errors(value: str) -> None:
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        parse_mask(value)


def test_labels_are_indices_without_a_mask_and_mask_entries_under_one() -> None:
    gpus = parse_nvidia_smi(FOUR_GPUS)
    assert gpu_labels(gpus, None) == (["0", "1", "2", "3"], [])
    assert gpu_labels(gpus, ["3", "1"]) == (["3", "1"], [])
    assert gpu_labels(gpus, [UUID2]) == ([UUID2], [])
    assert gpu_labels(gpus, ["GPU-2222aaaa"]) == (["GPU-2222aaaa"], [])  # a UUID prefix
    assert gpu_labels(gpus, ["7"]) == (["7"], ["7"])  # offered, but reported
    assert gpu_labels(gpus, []) == ([], [])
    assert gpu_labels([], ["0", "1"]) == ([], [])  # nothing found: no pool


def test_every_mask_label_is_a_valid_unit_label() -> None:
    labels, _ = gpu_labels(parse_nvidia_smi(FOUR_GPUS), parse_mask(f"0,{UUID2}"))
    assert parse_supply({"gpu": labels})[1] == {"gpu": ["0", UUID2]}


# --- auto in a spec -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "found", "rest"),
    [
        ("auto", True, ""),
        ("auto licence=2", True, "licence=2"),
        ("licence=2,auto", True, "licence=2"),
        ("gpu=[0, 1] auto", True, "gpu=[0, 1]"),
        ("licence=2", False, "licence=2"),
        ("autos=1", False, "autos=1"),
        ("auto=1", False, "auto=1"),
    ],
)
def test_auto_is_found_as_a_part_of_its_own(spec: str, found: bool, rest: str) -> None:
    assert split_auto(spec) == (found, rest)


def test_auto_expands_to_detected_pools_plus_the_written_ones() -> None:
    detected = detected_supply(["2", "3"], cpus=8, memory=16 * 2**30)
    assert expand_auto("auto", detected) == "cpus=8 gpu=[2,3] memory=17179869184"
    assert expand_auto("auto licence=2", detected) == (
        "cpus=8 gpu=[2,3] licence=2 memory=17179869184"
    )
    # A pool written out wins over the detected one of the same name.
    assert expand_auto("auto memory=1GiB gpu=[3]", detected) == ("cpus=8 gpu=[3] memory=1073741824")


def test_no_gpus_detected_means_no_gpu_pool() -> None:
    amounts, units = detected_supply([], cpus=2, memory=1000)
    assert units == {} and amounts == {"cpus": 2 * SCALE, "memory": 1000 * SCALE}


def test_auto_with_a_malformed_remainder_is_an_error() -> None:
    with pytest.raises(ValueError, match="NAME=AMOUNT"):
        expand_auto("auto licence", detected_supply([], 1, 1))


# --- split across processes ---------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "parts", "shares"),
    [
        (4, 2, [["0", "1"], ["2", "3"]]),
        (5, 2, [["0", "1", "2"], ["3", "4"]]),
        (4, 4, [["0"], ["1"], ["2"], ["3"]]),
        (7, 3, [["0", "1", "2"], ["3", "4"], ["5", "6"]]),
        (3, 1, [["0", "1", "2"]]),
    ],
)
def test_units_are_split_evenly_in_label_order(
    count: int, parts: int, shares: list[list[str]]
) -> None:
    assert split_labels([str(i) for i in range(count)], parts) == shares


def test_fewer_units_than_processes_is_an_error() -> None:
    with pytest.raises(ValueError, match="'gpu' has 3 units, fewer than the 4 worker processes"):
        split_labels(["0", "1", "2"], 4, name="gpu")


def test_split_supply_divides_indexed_pools_and_repeats_amounts() -> None:
    specs = split_supply(f"gpu=[0-2] tpu=[a,b] licence=1 memory=16GiB other=[{UUID2},x]", 2)
    assert specs == [
        f"gpu=[0,1] licence=1 memory=17179869184 other=[{UUID2}] tpu=[a]",
        "gpu=[2] licence=1 memory=17179869184 other=[x] tpu=[b]",
    ]
    assert split_supply("", 3) == ["", "", ""]


# --- apportion info -----------------------------------------------------------------


def test_info_shows_each_unit_free_busy_or_its_free_part() -> None:
    assert format_unit_states({"0": 1.0, "1": 0.0, "2": 0.5}) == "[0:free 1:busy 2:0.5]"


# --- probes, with a fake nvidia-smi first on PATH -----------------------------------


def fake_nvidia_smi(directory: Path, body: str) -> Path:
    """An executable ``nvidia-smi`` shell script in ``directory``."""
    script = directory / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return directory


def env_with(path: Path | None, **variables: str) -> dict[str, str]:
    """A minimal environment: PATH is only ``path`` (or empty), so no real nvidia-smi."""
    return {"PATH": str(path) if path else "", **variables}


@pytest.fixture
def four_gpus(tmp_path: Path) -> Path:
    return fake_nvidia_smi(tmp_path, f"cat <<'EOF'\n{FOUR_GPUS}EOF")


@pytest.mark.process
def test_probe_offers_every_device_nvidia_smi_lists(four_gpus: Path) -> None:
    assert probe_gpus(env_with(four_gpus)) == ["0", "1", "2", "3"]


@pytest.mark.process
def test_probe_under_a_mask_offers_exactly_the_masked_devices(four_gpus: Path) -> None:
    assert probe_gpus(env_with(four_gpus, CUDA_VISIBLE_DEVICES="2,3")) == ["2", "3"]
    assert probe_gpus(env_with(four_gpus, CUDA_VISIBLE_DEVICES=UUID2)) == [UUID2]


@pytest.mark.parametrize("mask", ["", "-1"])
def test_probe_with_an_empty_mask_offers_no_gpus(
    four_gpus: Path, mask: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, "apportion.worker"):
        assert probe_gpus(env_with(four_gpus, CUDA_VISIBLE_DEVICES=mask)) == []
    assert [r.message for r in caplog.records] == [
        f"no GPUs offered: CUDA_VISIBLE_DEVICES={mask!r} hides every device"
    ]


@pytest.mark.process
@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (None, "is not on PATH"),
        ("echo 'No devices were found'; exit 6", "exited with status 6 (No devices were found)"),
        ("echo 'Segmentation fault' >&2; exit 139", "exited with status 139 (Segmentation fault)"),
        ("echo 'WARNING: infoROM is corrupted'", "not understood"),
        ("true", "lists no devices"),
        ("exec sleep 30", "took over 0.3s"),
    ],
)
def test_probe_failures_mean_no_gpus_with_one_log_line(
    tmp_path: Path,
    body: str | None,
    reason: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(detect, "NVIDIA_SMI_TIMEOUT", 0.3)
    directory = tmp_path if body is None else fake_nvidia_smi(tmp_path, body)
    with caplog.at_level(logging.INFO, "apportion.worker"):
        assert probe_gpus(env_with(directory, CUDA_VISIBLE_DEVICES="0")) == []
    assert len(caplog.records) == 1
    assert caplog.records[0].message.startswith("no GPUs detected:")
    assert reason in caplog.records[0].message


@pytest.mark.process
def test_mask_naming_unknown_devices_is_offered_and_warned(
    four_gpus: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, "apportion.worker"):
        assert probe_gpus(env_with(four_gpus, CUDA_VISIBLE_DEVICES="1,9")) == ["1", "9"]
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "names 9" in caplog.records[0].message


def test_cpu_count_respects_affinity() -> None:
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    assert detect.cpu_count() == (expected or os.cpu_count())
    assert detect.memory_total() > 0

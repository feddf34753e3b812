"""Slurm node lists and hostfiles, expanded as ``scontrol show hostnames`` would."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.deploy.hostlist import compress_hosts, expand_nodelist, read_hostfile


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node[01-04]", ["node01", "node02", "node03", "node04"]),
        ("gpu[1,3-5],cpu7", ["gpu1", "gpu3", "gpu4", "gpu5", "cpu7"]),
        ("node[08-10]", ["node08", "node09", "node10"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("10.0.0.1,10.0.0.2", ["10.0.0.1", "10.0.0.2"]),
        ("[::1],user@[fe80::1]", ["[::1]", "user@[fe80::1]"]),
        ("alice@node[1-2]", ["alice@node1", "alice@node2"]),
        ("a, b", ["a", "b"]),
        ("a,a", ["a", "a"]),
    ],
)
def test_expand_examples(text: str, hosts: list[str]) -> None:
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node[1-", "unmatched '[' in host list 'node[1-'"),
        ("node]", "unmatched ']'"),
        ("n[[1]]", "nested '['"),
        ("n[a]", "bad range 'a' in 'n[a]'"),
        ("n[]", "bad range ''"),
        ("n[3-1]", "range '3-1' in host list 'n[3-1]' runs backwards"),
        ("a,,b", "empty entry in host list 'a,,b'"),
        ("", "empty entry"),
        ("n[1-1000000]", "more than 100000 hosts"),
        ("r[1-1000]-n[1-1000]", "more than 100000 hosts"),
    ],
)
def test_expand_refuses_bad_text_quoting_it(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        expand_nodelist(text)


def test_hostfile_skips_comments_and_blanks_and_keeps_duplicates() -> None:
    text = "# the scheduler\nhead01\n\n  node[1-2]   # workers\nnode1\n"
    assert read_hostfile(text) == ["head01", "node1", "node2", "node1"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a\nb slots=4\n", "hosts line 2: 'b slots=4' holds more than one word"),
        ("a\nn[2-1]\n", "hosts line 2: range '2-1'"),
        ("# nothing\n\n", "hosts names no host"),
    ],
)
def test_hostfile_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_hostfile(text, "hosts")


def test_compress_examples() -> None:
    hosts = ["n01", "n02", "n03", "n05", "x", "10.0.0.1", "10.0.0.2", "n1", "n1"]
    assert compress_hosts(hosts) == "n[01-03,05],x,10.0.0.1,10.0.0.2,n1,n1"


names = st.builds(
    lambda prefix, number, width: f"{prefix}{number:0{width}d}" if width else prefix,
    st.sampled_from(["node", "gpu", "rack1-n", "a.b", "x"]),
    st.integers(0, 120),
    st.integers(0, 3),
)
addresses = st.ip_addresses(v=4).map(str)


@settings(deadline=None)  # the machine is shared: timing is not what is tested
@given(st.lists(names | addresses, min_size=1, max_size=40))
def test_expanding_the_compressed_form_gives_the_list_back(hosts: list[str]) -> None:
    assert expand_nodelist(compress_hosts(hosts)) == hosts


@settings(deadline=None)  # the machine is shared: timing is not what is tested
@given(st.lists(names | addresses, min_size=1, max_size=40))
def test_a_hostfile_of_compressed_lines_gives_the_list_back(hosts: list[str]) -> None:
    half = len(hosts) // 2
    text = f"# cluster\n{compress_hosts(hosts[:half] or hosts)}\n\n"
    if half:
        text += f"{compress_hosts(hosts[half:])}  # rest\n"
    assert read_hostfile(text) == hosts

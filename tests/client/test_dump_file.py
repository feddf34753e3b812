"""A cluster dump's file: Dask's formats and names (``.msgpack.gz``, ``.yaml``) and our
``.json``, entries left out by name, and the errors for what cannot be written."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml

from apportion.client import dump_file
from apportion.client.dump_file import check_format, dump_path, encoded, without, write_dump

STATE: dict[str, Any] = {
    "workers": {"tcp://127.0.0.1:1": {"nthreads": 1, "units": {"gpu": ("0", "1")}}},
    "log": [(0.5, "x", "queued", "processing", "assigned")],
    "deaths": {3: "a key that is not text"},
    "odd": object,
}


@pytest.mark.parametrize(
    ("given", "fmt", "written"),
    [
        ("dump", "msgpack", "dump.msgpack.gz"),
        ("dump.msgpack.gz", "msgpack", "dump.msgpack.gz"),
        ("dump", "yaml", "dump.yaml"),
        ("dump.yaml", "yaml", "dump.yaml"),
        ("dump", "json", "dump.json"),
        ("state.json", "json", "state.json"),
        (Path("dir/dump"), "msgpack", "dir/dump.msgpack.gz"),
    ],
)
def test_the_suffix_of_the_format_is_added_once(given: Any, fmt: str, written: str) -> None:
    assert dump_path(given, fmt) == written


def test_an_unknown_format_is_a_value_error_naming_the_formats() -> None:
    with pytest.raises(ValueError, match=r"Unsupported format 'csv'.*'msgpack'.*'yaml'.*'json'"):
        check_format("csv")


def test_yaml_without_pyyaml_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        dump_file.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "yaml" else real(name, *a),
    )
    with pytest.raises(ImportError, match=r"needs PyYAML.*pip install pyyaml"):
        check_format("yaml")
    check_format("msgpack")  # the others need nothing more


def test_every_format_reads_back_as_the_same_plain_data() -> None:
    plain = {
        "workers": {"tcp://127.0.0.1:1": {"nthreads": 1, "units": {"gpu": ["0", "1"]}}},
        "log": [[0.5, "x", "queued", "processing", "assigned"]],
        "deaths": {"3": "a key that is not text"},
        "odd": str(object),
    }
    assert msgpack.unpackb(gzip.decompress(encoded(STATE, "msgpack"))) == plain
    assert yaml.safe_load(encoded(STATE, "yaml")) == plain
    assert json.loads(encoded(STATE, "json")) == plain


def test_exclude_leaves_entries_out_at_any_depth() -> None:
    state = {"log": [1], "workers": {"a": {"units": {}, "nthreads": 1}}, "rows": [{"log": 2}]}
    assert without(state, frozenset({"log", "units"})) == {
        "workers": {"a": {"nthreads": 1}},
        "rows": [{}],
    }


def test_files_and_file_urls_are_written(tmp_path: Path) -> None:
    assert write_dump(STATE, tmp_path / "a", "msgpack", {}) == f"{tmp_path}/a.msgpack.gz"
    with gzip.open(tmp_path / "a.msgpack.gz") as f:
        assert msgpack.unpack(f)["deaths"] == {"3": "a key that is not text"}
    if importlib.util.find_spec("fsspec") is not None:
        url = f"file://{tmp_path}/b"
        assert write_dump(STATE, url, "yaml", {}) == f"{url}.yaml"
        assert yaml.safe_load((tmp_path / "b.yaml").read_text())["odd"] == str(object)


def test_storage_options_for_a_local_path_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"storage options \(anon\) apply to URLs only"):
        write_dump(STATE, tmp_path / "a", "json", {"anon": True})
    assert list(tmp_path.iterdir()) == []

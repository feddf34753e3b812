"""``Future.type``: a result's class from the type name its worker sent, looked up
on the thread that reads it."""

from __future__ import annotations

import collections
import subprocess
import sys
import textwrap

from apportion.client.result_types import result_class
from apportion.client.state import ClientState
from apportion.protocol.tasks import KeysDone


class Outer:
    class Inner:
        pass


def test_names_resolve_to_their_classes() -> None:
    assert result_class("int") is int
    assert result_class("NoneType") is None  # not a builtin name: unknown, as Dask's None
    assert result_class("collections.OrderedDict") is collections.OrderedDict
    assert result_class(f"{__name__}.Outer.Inner") is Outer.Inner
    assert result_class("") is None
    assert result_class("no_such_module_here.Thing") is None
    assert result_class("collections.no_such_class") is None
    assert result_class("collections.namedtuple") is None  # a function, not a class
    assert result_class("mod.f.<locals>.C") is None


def test_the_client_keeps_the_type_it_is_told_and_what_it_knew() -> None:
    state = ClientState()
    state.ref("x")
    state.ref("y")
    state.keys["y"].type_name = "pandas.core.frame.DataFrame"  # it scattered y
    state.handle(KeysDone(["x", "y"], ["float", ""]))
    assert state.keys["x"].type_name == "float"
    assert state.keys["y"].type_name == "pandas.core.frame.DataFrame"
    state.ref("z")
    state.handle(KeysDone(["z"]))  # a peer that names no types
    assert state.keys["z"].type_name == ""


def test_the_class_is_imported_only_when_read() -> None:
    # The message names a module nobody imported: handling it imports nothing (on
    # the loop thread it would race the user's own imports); reading .type does.
    script = textwrap.dedent(
        """
        import sys
        from apportion.client.result_types import result_class
        from apportion.client.state import ClientState
        from apportion.protocol.tasks import KeysDone
        state = ClientState()
        state.ref("k")
        state.handle(KeysDone(["k"], ["fractions.Fraction"]))
        assert "fractions" not in sys.modules
        found = result_class(state.keys["k"].type_name)
        assert found is sys.modules["fractions"].Fraction
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr

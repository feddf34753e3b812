"""Dask's ``distributed.dashboard.link`` template, formatted as Dask formats it (pure)."""

from __future__ import annotations

import dask
import pytest

from apportion.dashboard.link_template import (
    DASK_DEFAULT,
    VARIABLE,
    configured_template,
    format_link,
)


def test_the_template_takes_scheme_host_port_and_environment_variables() -> None:
    link = format_link(
        "{scheme}://foo-{USER}:{port}/status", "http://127.0.0.1:12355", {"USER": "me"}
    )
    assert link == "http://foo-me:12355/status"
    assert format_link("{host}", "https://10.0.0.5:8787", {}) == "10.0.0.5"
    hub = "/user/{JUPYTERHUB_USER}/proxy/{port}/status"
    assert format_link(hub, "http://[::1]:9000", {"JUPYTERHUB_USER": "ann"}) == (
        "/user/ann/proxy/9000/status"
    )


def test_a_field_that_is_nothing_known_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match=r"names \{NOT_SET\}, which is neither scheme"):
        format_link("{scheme}://{NOT_SET}/", "http://127.0.0.1:1", {})


def test_only_a_template_the_user_set_replaces_the_login_link() -> None:
    with dask.config.set({"distributed.dashboard.link": None}):
        assert configured_template({}) is None
        assert configured_template({VARIABLE: "{host}"}) == "{host}"  # Dask's variable
    with dask.config.set({"distributed.dashboard.link": DASK_DEFAULT}):
        assert configured_template({}) is None  # Dask's default: apportion's link
    with dask.config.set({"distributed.dashboard.link": "https://proxy/{port}"}):
        assert configured_template({VARIABLE: "ignored"}) == "https://proxy/{port}"

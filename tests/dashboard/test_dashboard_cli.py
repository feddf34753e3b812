"""``apportion scheduler --dashboard-address``: a bad address is refused before anything starts."""

from __future__ import annotations

from click.testing import CliRunner

from apportion.cli.scheduler import scheduler


def test_a_bad_dashboard_address_is_refused_in_one_line() -> None:
    result = CliRunner().invoke(scheduler, ["--port", "0", "--dashboard-address", ":nope"])
    assert result.exit_code == 2
    assert "Error: --dashboard-address: invalid dashboard address ':nope'" in result.output

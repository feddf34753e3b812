"""How the command line reports bad input: one line on stderr, no usage banner."""

from __future__ import annotations

from typing import NoReturn

import click


def fail(ctx: click.Context, message: str, code: int = 2) -> NoReturn:
    """Print ``Error: message`` and exit with ``code`` (2: bad input)."""
    # One line: the message already names the bad part, a usage banner would bury it.
    click.echo(f"Error: {message}", err=True)
    ctx.exit(code)

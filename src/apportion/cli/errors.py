"""How the command line reports bad input: one line on stderr, no usage banner."""

from __future__ import annotations

from typing import NoReturn

import click

from apportion.net.address import check_host, parse_address


def fail(ctx: click.Context, message: str, code: int = 2) -> NoReturn:
    """Print ``Error: message`` and exit with ``code`` (2: bad input)."""
    # One line: the message already names the bad part, a usage banner would bury it.
    click.echo(f"Error: {message}", err=True)
    ctx.exit(code)


def check_address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback: refuse a malformed scheduler address at once, in one line (status 2).

    Checked before anything connects, so that ``http://host:8786`` or ``host:abc``
    is named as the mistake rather than surfacing later as a connection failure.
    """
    if value is not None:
        try:
            parse_address(value)
        except ValueError as exc:
            fail(ctx, f"{_option_name(param)}: {exc}")
    return value


def check_host_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Click callback for ``--host``: a host name or an IP address, nothing more."""
    try:
        check_host(value)
    except ValueError as exc:
        fail(ctx, f"{_option_name(param)}: {exc}")
    return value


def check_port_option(ctx: click.Context, param: click.Parameter, value: str | int) -> int:
    """Click callback for ``--port``: 0-65535, refused in one line rather than a usage banner."""
    text = str(value).strip()
    if not text.isascii() or not text.isdigit() or int(text) > 65535:
        fail(ctx, f"{_option_name(param)}: invalid port {str(value)!r}: use a number in 0-65535")
    return int(text)


def _option_name(param: click.Parameter) -> str:
    if isinstance(param, click.Option) and param.opts:
        return max(param.opts, key=len)
    return (param.name or "address").upper()

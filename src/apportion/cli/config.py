"""``--config FILE``: option defaults from a TOML file.

The file's keys are the command's option names with underscores (``nthreads``,
``resources``, ``split_units``); values are what the option takes, so ``resources``
is the same spec string as on the command line. Options given on the command line
(or through their environment variable) override the file. An unknown key is an
error rather than ignored: a misspelt ``resource = ...`` would otherwise leave a
worker without its GPUs and no word said.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from typing import Any, TypeVar

import click

from apportion.cli.errors import fail

#: Where the path of the file in use is kept in ``ctx.meta``, for error messages.
CONFIG_META = "apportion.config"

F = TypeVar("F", bound=Callable[..., Any])


def read_config(path: str, allowed: set[str]) -> dict[str, Any]:
    """The table in the TOML file at ``path``; ``ValueError`` for anything wrong with it."""
    try:
        with open(path, "rb") as file:
            table = tomllib.load(file)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None
    for key in table:
        if key not in allowed:
            raise ValueError(f"{path}: unknown key {key!r} (known: {', '.join(sorted(allowed))})")
    return table


def load_config(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Eager callback of ``--config``: the file's values become the command's defaults.

    Each value is converted by its option's type now, so that a wrong one is reported
    with the file's name, on one line, with exit status 2.
    """
    if value is None:
        return None
    options = {
        p.name: p
        for p in ctx.command.params
        if isinstance(p, click.Option) and p.name is not None and p.name != param.name
    }
    try:
        table = read_config(value, set(options))
        defaults = {}
        for key, raw in table.items():
            if isinstance(raw, dict | list):
                raise ValueError(f"{value}: {key} must be a single value, not {raw!r}")
            try:
                defaults[key] = options[key].type_cast_value(ctx, raw)
            except click.BadParameter as exc:
                raise ValueError(f"{value}: {key}: {exc.message}") from None
    except ValueError as exc:
        fail(ctx, f"--config: {exc}")
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    ctx.meta[CONFIG_META] = value
    return value


def config_option(help_text: str) -> Callable[[F], F]:
    """The ``--config FILE`` option, processed before the others."""
    return click.option(
        "--config",
        metavar="FILE",
        is_eager=True,
        expose_value=False,
        callback=load_config,
        help=help_text,
    )

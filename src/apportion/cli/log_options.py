"""``--log-format``, shared by the long-running commands, and how they speak on stderr.

Each command passes the chosen format to ``log_setup.configure_logging`` with its
role; the format then reaches the processes it starts through
``APPORTION_LOG_FORMAT``, which is also the option's default.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TypeVar

import click

from apportion.log_setup import FORMAT_VARIABLE, FORMATS

F = TypeVar("F", bound=Callable[..., object])

logger = logging.getLogger("apportion.cli")


def log_format_option(command: F) -> F:
    """``--log-format text|json``, passed to the command as ``log_format``."""
    option = click.option(
        "--log-format",
        type=click.Choice(FORMATS, case_sensitive=False),
        default=FORMATS[0],
        envvar=FORMAT_VARIABLE,
        show_envvar=True,
        show_default=True,
        help="How log records are written to stderr: text lines, or one JSON object per "
        "line (time, level, logger, message, role, pid, exception and extra fields). "
        "Processes this command starts inherit it.",
    )
    return option(command)


def announce(message: str, level: int = logging.INFO) -> None:
    """Tell the user ``message`` on stderr: a plain line, or a log record at ``level``
    when logging JSON, so that stderr stays one JSON object per line for whatever
    reads it."""
    if os.environ.get(FORMAT_VARIABLE) == "json":
        logger.log(level, message)
    else:
        click.echo(message, err=True)

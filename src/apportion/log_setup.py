"""Log set-up shared by the long-running commands."""

from __future__ import annotations

import logging
import os
import sys

from apportion.log_format import JsonFormatter

#: Overrides the default INFO level of ``apportion scheduler`` and ``apportion worker``;
#: a LocalCluster sets it to WARNING for its worker processes, so they do not chatter
#: into the user's terminal.
LEVEL_VARIABLE = "APPORTION_LOG_LEVEL"

#: ``text`` or ``json``: the default of ``--log-format``. ``configure_logging`` sets it
#: to the format chosen, so the processes a command starts (a supervisor's workers,
#: ``apportion slurm``'s scheduler and workers) write the same format.
FORMAT_VARIABLE = "APPORTION_LOG_FORMAT"

#: The values of ``--log-format`` and ``APPORTION_LOG_FORMAT``.
FORMATS = ("text", "json")

#: The text format; ``client.local_processes.line_level`` reads its level field.
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def configure_logging(role: str, log_format: str = "text") -> None:
    """Log to stderr in ``log_format`` at $APPORTION_LOG_LEVEL (default INFO).

    ``role`` names the command in JSON records ("scheduler", "worker", ...). The
    format is also exported to this process's environment for its children. Like
    ``logging.basicConfig``, this leaves a root logger that has handlers alone.
    """
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r}: use one of {', '.join(FORMATS)}")
    os.environ[FORMAT_VARIABLE] = log_format
    level = os.environ.get(LEVEL_VARIABLE, "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter(role) if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    logging.basicConfig(level=getattr(logging, level, logging.INFO), handlers=[handler])

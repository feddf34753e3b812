"""Log set-up shared by the long-running commands."""

from __future__ import annotations

import logging
import os

#: Overrides the default INFO level of ``apportion scheduler`` and ``apportion worker``;
#: a LocalCluster sets it to WARNING for its worker processes, so they do not chatter
#: into the user's terminal.
LEVEL_VARIABLE = "APPORTION_LOG_LEVEL"


def configure_logging() -> None:
    level = os.environ.get(LEVEL_VARIABLE, "INFO").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )

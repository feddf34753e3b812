"""The dashboard link as Dask's ``distributed.dashboard.link`` setting writes it.

Behind a proxy (JupyterHub's ``/user/{JUPYTERHUB_USER}/proxy/{port}/status``, a
cloud console) the address the dashboard listens on is not the one a browser
opens, so Dask lets users give a template, formatted with ``scheme``, ``host``,
``port`` and every environment variable. apportion honours the same setting for
``Client.dashboard_link`` and ``LocalCluster.dashboard_link``. Left unset (or at
Dask's default, which names the address apportion knows already), the link is
apportion's own one-time login link instead: a template cannot carry a login.

Dask's configuration is read only when this program has imported Dask (a client
never imports it), else from the ``DASK_DISTRIBUTED__DASHBOARD__LINK`` variable
Dask itself would read.
"""

from __future__ import annotations

import os
import string
import sys
from collections.abc import Mapping
from urllib.parse import urlsplit

CONFIG_KEY = "distributed.dashboard.link"
VARIABLE = "DASK_DISTRIBUTED__DASHBOARD__LINK"
#: Dask's own default: the dashboard's address, which apportion's link has already.
DASK_DEFAULT = "{scheme}://{host}:{port}/status"


def configured_template(environ: Mapping[str, str] = os.environ) -> str | None:
    """The template the user set, or None where none is set (or Dask's default is)."""
    template: object = None
    dask = sys.modules.get("dask")
    config = getattr(dask, "config", None)
    if config is not None:
        template = config.get(CONFIG_KEY, None)
    if template is None:
        template = environ.get(VARIABLE)
    if not isinstance(template, str) or not template or template == DASK_DEFAULT:
        return None
    return template


def format_link(template: str, base_url: str, environ: Mapping[str, str]) -> str:
    """``template`` for the dashboard at ``base_url`` (``http://host:port``), as Dask
    formats it; ``ValueError`` naming a field that is neither ``scheme``, ``host``,
    ``port`` nor an environment variable."""
    parts = urlsplit(base_url)
    fields = {
        **environ,
        "scheme": parts.scheme or "http",
        "host": parts.hostname or "",
        "port": parts.port if parts.port is not None else "",
    }
    for _, name, _, _ in string.Formatter().parse(template):
        if name is not None and name.split(".")[0].split("[")[0] not in fields:
            raise ValueError(
                f"{CONFIG_KEY} {template!r} names {{{name}}}, which is neither scheme, "
                "host, port nor a set environment variable"
            )
    return template.format(**fields)

"""A ``LocalCluster`` in Jupyter: its card, and a widget that keeps the card current.

``card`` gathers what the card shows (dashboard/card.py draws it) from the
cluster's scheduler, which runs in this process: a fresh picture every time.
``display`` is ``_ipython_display_``: with ipywidgets installed, an HTML widget
that a daemon thread redraws every few seconds until the cluster closes, as
Dask's cluster widget stays current; without it, the card itself, once. Neither
IPython nor ipywidgets is a dependency: both are imported only here, only when a
notebook asks.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from typing import Any, Protocol

from apportion.dashboard.card import CardFacts, render

#: Seconds between redraws of a cluster's widget.
REDRAW_SECONDS = 2.0


class _Scheduler(Protocol):
    def info(self) -> dict[str, Any]: ...


class ShownCluster(Protocol):
    """What the card and the widget read of a ``LocalCluster``."""

    name: str
    scheduler_address: str
    #: The widget ``display`` made, kept so that every display shows the same one.
    _cached_widget: Any
    _closed: bool
    _loop: Any

    @property
    def scheduler(self) -> _Scheduler: ...

    @property
    def dashboard_link(self) -> str | None: ...

    def _repr_html_(self) -> str: ...


def card(cluster: ShownCluster) -> str:
    """The cluster's card: its scheduler, workers, pools and dashboard link, now."""
    if cluster._closed:
        status, info = "closed", None
    elif cluster._loop is None:
        status, info = "not started: await it", None
    else:
        status, info = "running", _info(cluster)
    note = "" if info is not None or status != "running" else "the scheduler did not answer"
    dashboard = cluster.dashboard_link if info is not None else None
    facts = CardFacts(
        "LocalCluster",
        cluster.name,
        status,
        cluster.scheduler_address,
        info,
        dashboard,
        time.time(),
        note,
    )
    return render(facts)


def _info(cluster: ShownCluster) -> dict[str, Any] | None:
    try:
        return cluster.scheduler.info()
    except TimeoutError:  # a stuck loop: the card says so instead of raising
        return None


def display(cluster: ShownCluster) -> None:
    """Show the cluster in the running notebook (``LocalCluster._ipython_display_``)."""
    from IPython.display import (  # type: ignore[import-not-found, unused-ignore]
        display as show,
    )

    try:
        import ipywidgets  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        show({"text/plain": repr(cluster), "text/html": cluster._repr_html_()}, raw=True)
        return
    if cluster._cached_widget is None:
        cluster._cached_widget = ipywidgets.HTML(value=cluster._repr_html_())
        _keep_current(cluster, cluster._cached_widget)
    show(cluster._cached_widget)


def _keep_current(cluster: ShownCluster, widget: Any) -> None:
    """Redraw ``widget`` from a daemon thread until the cluster closes or is dropped
    (the thread holds it weakly, so a forgotten cluster still gets finalised)."""
    ref = weakref.ref(cluster)
    pace = threading.Event()  # never set: its wait is the pause between redraws

    def follow() -> None:
        while not pace.wait(REDRAW_SECONDS):
            shown = ref()
            if shown is None:
                return
            with contextlib.suppress(Exception):  # a redraw must not kill the thread
                widget.value = shown._repr_html_()
            if shown._closed:
                return
            del shown

    threading.Thread(target=follow, name="apportion-cluster-widget", daemon=True).start()

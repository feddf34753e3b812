"""The Jupyter form of ``progress``: one ipywidgets bar per task group.

Imported only when ``progress`` runs in a kernel with ipywidgets installed; a
daemon thread updates the bars until every future is done, so the cell returns
at once, as with Dask's widget.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import ipywidgets  # type: ignore[import-not-found, unused-ignore]

from apportion.client.progress_tally import Tally


class ProgressWidget:
    """Bars that keep themselves current; shown by returning it from a cell."""

    def __init__(self, tally: Tally, interval: float) -> None:
        self._tally = tally
        self._bars: dict[str, Any] = {}
        rows = []
        for group, _, _, total in tally.rows():
            bar = ipywidgets.IntProgress(min=0, max=max(total, 1), description=group)
            label = ipywidgets.HTML()
            self._bars[group] = (bar, label)
            rows.append(ipywidgets.HBox([bar, label]))
        self.widget = ipywidgets.VBox(rows)
        self._update()
        thread = threading.Thread(target=self._follow, args=(interval,), daemon=True)
        thread.start()

    def _follow(self, interval: float) -> None:
        while not self._tally.wait(interval):
            self._update()
        self._update()

    def _update(self) -> None:
        elapsed = time.monotonic() - self._tally.start
        for group, done, failed, total in self._tally.rows():
            bar, label = self._bars[group]
            bar.value = done + failed
            if failed:
                bar.bar_style = "danger"
            elif done == total:
                bar.bar_style = "success"
            label.value = f"{done + failed} / {total} ({failed} failed) {elapsed:.1f}s"

    def _ipython_display_(self) -> None:
        from IPython.display import display  # type: ignore[import-not-found, unused-ignore]

        display(self.widget)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

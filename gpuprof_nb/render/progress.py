"""Progress over a known number of tasks (the ladder's measurements, a run's ranks): an
ipywidgets IntProgress in a live kernel, text lines otherwise."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from gpuprof_nb.render.widgets import live_kernel


class Progress:
    """Counts tasks done out of `total`; shows nothing when `enabled` is False. `what` names
    the work (the bar's label) and `unit` the tasks (the closing line)."""

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        what: str = "ladder",
        unit: str = "measurements",
    ) -> None:
        self.total = max(total, 1)
        self.what = what
        self.unit = unit
        self.done = 0
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout
        self._bar: Any = None
        self._label: Any = None
        self._box: Any = None
        self._handle: Any = None
        if enabled and live_kernel():
            try:
                import ipywidgets as widgets
                from IPython.display import display
            except ImportError:
                return
            self._bar = widgets.IntProgress(value=0, min=0, max=self.total, description=what)
            self._label = widgets.Label(value="starting")
            self._box = widgets.HBox([self._bar, self._label])
            self._handle = display(self._box, display_id=True)

    def start(self, label: str) -> None:
        """Say which task runs now."""
        if not self.enabled:
            return
        if self._label is not None:
            self._label.value = f"{self.done + 1}/{self.total}: {label}"
        else:
            print(f"[{self.done + 1}/{self.total}] {label} ...", file=self.stream, flush=True)

    def finish(self, outcome: str) -> None:
        """Count one task as done and say how it went."""
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.value = min(self.done, self.total)
            self._label.value = f"{self.done}/{self.total}: {outcome}"
        else:
            print(f"    {outcome}", file=self.stream, flush=True)

    def close(self) -> None:
        """Replace the live bar with a text line and close the widget: a saved notebook
        reopened without its kernel would otherwise show "Error displaying widget"."""
        if self._bar is None:
            return
        from IPython.display import Pretty

        line = f"{self.what}: {self.done}/{self.total} {self.unit} done"
        if self._handle is not None:
            self._handle.update(Pretty(line))
        self._box.close()
        self._bar = self._label = self._box = self._handle = None

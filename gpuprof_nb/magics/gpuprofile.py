"""IPython glue for `%%gpuprofile`: parse the line (options.py), have the session run the
cell (session/profile.py), publish the report (store under -o, show unless --quiet, the
--baseline comparison first). No capture, analysis or formatting here."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, cell_magic, magics_class, no_var_expand

from gpuprof_nb.capture.cell import CellCompiler
from gpuprof_nb.magics.options import (
    GPUPROFILE_OPTIONS,
    OptionLines,
    Publish,
    baseline_report,
    with_options,
)
from gpuprof_nb.results.report import ProfileReport
from gpuprof_nb.session.files import writable_problem
from gpuprof_nb.session.options import ProfileOptions


@magics_class
class GpuprofileMagics(Magics):
    """The `%%gpuprofile` cell magic."""

    # The clock the timed runs read (nanoseconds); tests put a fake one here.
    clock: Callable[[], int] = staticmethod(time.perf_counter_ns)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        # Per shell: option lines already parsed, cells already transformed and compiled.
        self._options = OptionLines(self.gpuprofile.parser)
        self._cells = CellCompiler(shell)

    @with_options(GPUPROFILE_OPTIONS)
    @cell_magic
    @no_var_expand
    def gpuprofile(self, line: str, cell: str) -> None:
        """Time and profile the cell: warm-up runs, timed samples (no profiler), then one
        run under torch.profiler; show where the time goes. Times are per run: a sample of a
        short cell is a block of back-to-back runs (see --number), its time divided by the
        runs in it.

        Example::

            %%gpuprofile -o report --trace build/trace.json.gz
            loss = model(x).sum(); loss.backward(); opt.step()
        """
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame in user tracebacks
        if "$" in line or "{" in line:
            # IPython's `$name` and `{expr}` in the option line, expanded as IPython would
            # (in the same frame: this one sits between it and the user's). The magic opts out
            # of IPython's own expansion, which copies the user namespace on every call even
            # when there is nothing to expand (it grows by a name per cell run).
            line = self._ip.var_expand(line, 3)
        options, publish = self._options.parse(line)
        if options.trace_path:
            # Checked before the cell runs (not cached with the line: the path may change).
            problem = writable_problem(options.trace_path, "--trace")
            if problem:
                raise UsageError(f"%%gpuprofile {problem}")
        baseline = (
            baseline_report(publish.baseline, self._ip.user_ns)
            if publish.baseline is not None
            else None
        )
        if not cell.strip():
            raise UsageError(
                "%%gpuprofile: the cell is empty; put the code to profile below the magic "
                "line, e.g. `%%gpuprofile` then `y = model(x)`"
            )
        try:
            import torch  # noqa: F401 - fail here, clearly, before anything runs

            from gpuprof_nb.session.profile import ProfilerBusy, run_cell
        except ImportError as exc:
            raise UsageError(
                f"%%gpuprofile needs PyTorch ({exc}); install it with `pip install torch`"
            ) from exc
        try:
            report = run_cell(
                self._cells,
                cell,
                options,
                clock=self.clock,
                show_partial=lambda partial: self._publish(partial, publish, options),
            )
        except ProfilerBusy as exc:
            raise UsageError(f"%%gpuprofile: {exc}") from None
        self._publish(report, publish, options, baseline)

    def _publish(
        self,
        report: ProfileReport,
        publish: Publish,
        options: ProfileOptions,
        baseline: ProfileReport | None = None,
    ) -> None:
        """Store the report under -o NAME and show it unless --quiet: the tabbed report, or,
        after --timing-only, its text printed the way %timeit prints (a rich display costs
        ipykernel two synchronous stdout/stderr flushes, a few percent of a cell of a few
        milliseconds, which --timing-only must not add: benchmarks/RESULTS.md, "Measurements
        behind design choices", M13, and section 1; the stored report still displays as
        HTML). With --baseline, the comparison with it comes first (after --timing-only: its
        verdict)."""
        if publish.output:
            self._ip.user_ns[publish.output] = report
        if publish.quiet:
            return
        comparison = None
        if baseline is not None and publish.baseline is not None:
            comparison = _compare(baseline, report, publish.baseline)
        if options.timing_only:
            if comparison is not None:
                from gpuprof_nb.render.compare import verdict_words

                print(f"vs {publish.baseline}: {verdict_words(comparison)}")
            else:
                _print_report(report)
            return
        if comparison is not None:
            _display_report(comparison)
        _display_report(report)

    @property
    def _ip(self) -> InteractiveShell:
        """The shell this magic is registered with (Magics types it as optional)."""
        if self.shell is None:
            raise UsageError("%%gpuprofile runs inside an IPython shell or Jupyter kernel")
        return self.shell


def _compare(baseline: ProfileReport, report: ProfileReport, name: str) -> Any:
    """Return the comparison of `report` with the --baseline report, or None (with the
    reason printed) when it cannot be made: the run's own report is shown either way."""
    from gpuprof_nb.session.analyze import compare

    try:
        return compare(baseline, report, before_label=name, after_label="this run")
    except Exception as exc:  # noqa: BLE001 - shown to the user
        print(f"%%gpuprofile --baseline {name}: no comparison ({type(exc).__name__}: {exc})")
        return None


def _display_report(report: Any) -> None:
    """Display the report's own mimebundle. Straight to the display publisher: IPython's
    display() would also ask eight other formatters (PNG, LaTeX, ...) for representations
    the report does not have, a cost on every cell (benchmarks/RESULTS.md, "Measurements
    behind design choices", M13). If building the bundle fails, display() shows that error
    as it does for any object."""
    from IPython.display import display, publish_display_data

    try:
        bundle = report._repr_mimebundle_()
    except Exception:  # noqa: BLE001 - display() reports it the usual way
        display(report)
        return
    data, metadata = bundle if isinstance(bundle, tuple) else (bundle, {})
    publish_display_data(data, metadata=metadata)


def _print_report(report: ProfileReport) -> None:
    """Print the report's text. If rendering it fails, print its repr and why instead: the
    cell has run, and the report stays stored under -o."""
    try:
        text = report.text()
    except Exception as exc:  # noqa: BLE001 - shown to the user, not swallowed
        text = f"{report!r}\n(the report's text could not be rendered: {type(exc).__name__}: {exc})"
    print(text)

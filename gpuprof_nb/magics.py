"""IPython glue: `%%gpuprofile` (and registering `%%memsnap`). Parse arguments, capture,
load, analyse, display, store. No analysis or formatting lives here."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, cell_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from gpuprof_nb.capture.cell import CellCompiler, block_builder, remember

TRACE_SOURCE = "%%gpuprofile cell"


@magics_class
class GpuprofileMagics(Magics):
    """The `%%gpuprofile` cell magic."""

    # The clock the timed runs read (nanoseconds); tests put a fake one here.
    clock: Callable[[], int] = staticmethod(time.perf_counter_ns)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        # Per shell: option lines already parsed, cells already transformed and compiled.
        self._args_cache: dict[str, Any] = {}
        self._cells = CellCompiler(shell)

    @magic_arguments()
    @argument("--warmup", type=int, default=None, metavar="N",
              help="unmeasured runs before timing (default: at least 1, and more while "
                   "they add up to under 5 ms, so a short cell reaches its steady pace "
                   "before it is timed; a cell of 5 ms or more warms up once)")
    @argument("--repeat", type=int, default=3, metavar="N",
              help="timed samples, without the profiler attached (default 3); a sample "
                   "is one run, or a block of --number back-to-back runs for short cells")
    @argument("--number", type=int, default=None, metavar="K",
              help="runs per timed sample; times are shown per run (block time / K). "
                   "Default: chosen like timeit does: a cell faster than 0.5 ms per run "
                   "(going by the warm-up, or by the first timed run, then not kept, when "
                   "the warm-up was a slow cold start) runs one untimed calibration block, "
                   "then samples of K back-to-back runs lasting about 1 ms, so clock reads "
                   "and call overhead vanish from the per-run time; slower cells, --warmup "
                   "0 and cells that change grad/autocast mode run once per sample. "
                   "--number 1 --warmup N: the cell runs exactly N + --repeat (+ 1 profiled) "
                   "times")
    @argument("--once", action="store_true",
              help="run the cell exactly once (cells with side effects), timed and "
                   "profiled together; the numbers then include cold-start effects "
                   "(--warmup and --repeat are ignored)")
    @argument("--timing-only", action="store_true",
              help="time the cell (CUDA events on GPU) without running the profiler; the "
                   "summary is printed as text, like %%timeit (-o NAME keeps the report, "
                   "whose display is the HTML summary)")
    @argument("--stack", action="store_true", help="record Python call stacks")
    @argument("--memory", action="store_true", help="record allocator events")
    @argument("--top", type=int, default=20, metavar="N",
              help="rows in the top-ops table (default 20)")
    @argument("--sort", default=None, metavar="KEY",
              help="order of the top-ops table: self_device_us, total_device_us, "
                   "self_cpu_us, total_cpu_us or calls (key_averages names such as "
                   "self_cuda_time_total work too); default: self device time on GPU, "
                   "self CPU time on CPU")
    @argument("--trace", default=None, metavar="PATH",
              help="also write the Chrome/Perfetto trace JSON here (gzip if PATH ends in .gz)")
    @argument("--baseline", default=None, metavar="NAME",
              help="compare this run with the report stored in the variable NAME (an "
                   "earlier %%gpuprofile -o NAME) and show the comparison first: faster, "
                   "slower or no clear change, and what changed; with --timing-only, the "
                   "verdict alone")
    @argument("-o", dest="output", default=None, metavar="NAME",
              help="store the ProfileReport in the variable NAME")
    @argument("--quiet", action="store_true", help="display nothing")
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
        args = self._parse(line)
        baseline = self._baseline(args.baseline)
        if not cell.strip():
            raise UsageError(
                "%%gpuprofile: the cell is empty; put the code to profile below the magic "
                "line, e.g. `%%gpuprofile` then `y = model(x)`"
            )
        try:
            import torch  # noqa: F401 - fail here, clearly, before anything runs

            from gpuprof_nb.capture.cell import CellRunner
            from gpuprof_nb.capture.profiler import (
                ProfilerStoppedByCell,
                profile_cell,
                profiler_running,
            )
            from gpuprof_nb.capture.timing import time_cell
        except ImportError as exc:
            raise UsageError(
                f"%%gpuprofile needs PyTorch ({exc}); install it with `pip install torch`"
            ) from exc
        if profiler_running():
            # Checked before any run: timed runs under someone else's profiler would be
            # inflated, and ours could not start afterwards.
            raise UsageError(
                "%%gpuprofile: a torch profiler is already recording (started in an earlier "
                "cell?); stop it first (prof.stop() or leave its `with` block)"
            )
        code, source = self._cells.compile(cell)
        cuda = _cuda_available()
        runner = CellRunner(code, self._ip.user_ns)
        # The timed runs call exec directly: no Python frame of ours between the clock
        # reads and the cell's code (a method call per run showed in ~10 us cells).
        run = functools.partial(exec, code, self._ip.user_ns)
        notes = _notes(args, cuda)
        device_name = _device_name(cuda)
        sync = _cuda_sync if cuda else None
        stats = None
        artifact = None
        try:
            if args.once and not args.timing_only:
                # One run only: it is both timed and profiled, so its time includes the
                # profiler's overhead (said in the notes).
                box: list[Any] = []

                def timed_once() -> None:
                    __tracebackhide__ = True  # noqa: F841
                    box.append(time_cell(runner, once=True, sync=sync, use_cuda_events=cuda,
                                         device_name=device_name, clock=self.clock,
                                         before_each=runner.restore_modes))

                try:
                    artifact = profile_cell(timed_once, runs=1, stack=args.stack,
                                            memory=args.memory, cuda=cuda)
                except ProfilerStoppedByCell as exc:
                    notes.append(f"no trace: {exc}")
                stats = dataclasses.replace(box[0], profiled=True)
            else:
                stats = time_cell(run, warmup=args.warmup, repeat=args.repeat,
                                  once=args.once, sync=sync, use_cuda_events=cuda,
                                  device_name=device_name, before_each=runner.restore_modes,
                                  number=args.number, clock=self.clock,
                                  run_block=block_builder(self._cells, source, code))
                if stats.number > 1:
                    notes.append(_block_note(stats.number, args.number is None))
                if not args.timing_only:
                    runner.restore_modes()
                    try:
                        artifact = profile_cell(runner, runs=1, stack=args.stack,
                                                memory=args.memory, cuda=cuda)
                    except ProfilerStoppedByCell as exc:
                        # The timings stand; only the trace is lost, so say so and go on.
                        notes.append(f"no trace: {exc}")
                    except BaseException as exc:
                        # The timed runs had finished: their numbers stand, so they are
                        # shown (and stored) before the cell's own error propagates.
                        self._publish_partial(stats, notes, exc, args)
                        raise
        finally:
            runner.restore_modes()
        self._publish(self._report(stats, artifact, args, notes), args, baseline)

    def _publish(self, report: Any, args: Any, baseline: Any = None) -> None:
        """Store the report under -o NAME and show it unless --quiet: the tabbed report, or,
        after --timing-only, its text printed the way %timeit prints (a rich display costs
        ipykernel two synchronous stdout/stderr flushes, about 0.4 ms: 5% of an 8 ms cell,
        which --timing-only must not add; the stored report still displays as HTML). With
        --baseline, the comparison with it comes first (after --timing-only: its verdict)."""
        if args.output:
            self._ip.user_ns[args.output] = report
        if args.quiet:
            return
        comparison = _compare(baseline, report, args.baseline) if baseline is not None \
            else None
        if args.timing_only:
            if comparison is not None:
                from gpuprof_nb.render.compare import verdict_words

                print(f"vs {args.baseline}: {verdict_words(comparison)}")
            else:
                _print_report(report)
            return
        if comparison is not None:
            _display_report(comparison)
        _display_report(report)

    def _baseline(self, name: str | None) -> Any:
        """Return the report stored under --baseline NAME, checked before the cell runs."""
        if name is None:
            return None
        from gpuprof_nb.results.report import ProfileReport

        if not name.isidentifier():
            raise UsageError(f"%%gpuprofile --baseline needs a variable name, got {name!r}")
        if name not in self._ip.user_ns:
            raise UsageError(
                f"%%gpuprofile --baseline {name}: no variable {name!r}; store a report first "
                f"with `%%gpuprofile -o {name}`")
        value = self._ip.user_ns[name]
        if not isinstance(value, ProfileReport):
            raise UsageError(
                f"%%gpuprofile --baseline {name}: {name!r} is a {type(value).__name__}, not a "
                f"ProfileReport; store one with `%%gpuprofile -o {name}`")
        return value

    def _publish_partial(self, stats: Any, notes: list[str], exc: BaseException,
                         args: Any) -> None:
        """Publish a timing-only report after the profiled run raised; never raise itself,
        so the user's exception is the one that propagates."""
        from gpuprof_nb.results.report import ProfileReport

        why = f"the profiled run raised {type(exc).__name__}: only the timed runs are shown"
        try:
            self._publish(ProfileReport(timing=stats, trace=None, notes=(why, *notes)), args)
        except Exception:  # noqa: BLE001, S110 - the cell's error matters more than ours
            pass

    @property
    def _ip(self) -> InteractiveShell:
        """The shell this magic is registered with (Magics types it as optional)."""
        if self.shell is None:
            raise UsageError("%%gpuprofile runs inside an IPython shell or Jupyter kernel")
        return self.shell

    def _parse(self, line: str) -> Any:
        """Return the parsed options; every mistake becomes a UsageError with the usage.
        A line parsed before comes from a cache (argparse costs ~30 us; the namespace is
        never modified)."""
        args = self._args_cache.get(line)
        if args is None:
            args = self._parse_uncached(line)
            remember(self._args_cache, line, args)
        return args

    def _parse_uncached(self, line: str) -> Any:
        parser = self.gpuprofile.parser
        try:
            args = parse_argstring(self.gpuprofile, line)
        except UsageError as exc:
            raise UsageError(f"%%gpuprofile: {exc}\n{_usage(parser)}") from None
        except ValueError as exc:  # unbalanced quotes in the option line
            raise UsageError(f"%%gpuprofile: {exc}\n{_usage(parser)}") from None
        problems = []
        if args.warmup is not None and args.warmup < 0:
            problems.append(f"--warmup must be 0 or more, got {args.warmup}")
        if args.repeat < 1:
            problems.append(f"--repeat must be 1 or more, got {args.repeat}")
        if args.number is not None and args.number < 1:
            problems.append(f"--number must be 1 or more, got {args.number}")
        if args.number is not None and args.once:
            problems.append("--number times repeated runs; --once runs the cell once: "
                            "drop one of them")
        if args.top < 1:
            problems.append(f"--top must be 1 or more, got {args.top}")
        if args.output is not None and not args.output.isidentifier():
            problems.append(f"-o needs a Python variable name, got {args.output!r}")
        if args.timing_only and args.trace:
            problems.append("--trace needs a profiled run; drop --timing-only")
        if args.timing_only and (args.stack or args.memory):
            problems.append("--stack/--memory need the profiler; drop --timing-only")
        if args.sort is not None:
            problem = _check_sort_key(args.sort)
            if problem:
                problems.append(problem)
        if problems:
            raise UsageError("%%gpuprofile: " + "; ".join(problems) + "\n" + _usage(parser))
        return args

    def _report(self, stats: Any, artifact: Any, args: Any, notes: list[str]) -> Any:
        from gpuprof_nb.results.report import ProfileReport

        if artifact is None:
            return ProfileReport(timing=stats, trace=None, notes=tuple(notes))
        from gpuprof_nb.analysis.report import analyze, count_steps_per_run
        from gpuprof_nb.capture.device import trace_device_spec
        from gpuprof_nb.errors import GpuprofError
        from gpuprof_nb.io.trace import save_trace_dict, trace_from_dict

        if args.stack:
            self._name_cells(artifact)
        try:
            trace = trace_from_dict(artifact, TRACE_SOURCE)
        except GpuprofError as exc:
            # The cell has run and may not be repeatable: keep its timings and the raw trace
            # (.save(path) writes it) instead of losing both to a reader error.
            notes.append(f"the recorded trace could not be read: {exc}")
            return ProfileReport(timing=stats, trace=None, artifact=artifact, notes=tuple(notes))
        steps = count_steps_per_run(trace)
        if steps and stats is not None:
            stats = dataclasses.replace(stats, steps_per_run=steps)
        if args.trace:
            # The run is done and costly to repeat: a trace that cannot be written becomes a
            # note in the report (which -o still stores) rather than an error that loses it.
            try:
                path = save_trace_dict(artifact, args.trace)
                notes.append(f"trace written to {path} (open it in ui.perfetto.dev)")
            except GpuprofError as exc:
                notes.append(f"trace NOT written: {exc}; call .save(path) on the report")
        # --sort was checked before the cell ran, so a failure here is ours, not the user's:
        # keep the timings and the raw trace, and say what broke.
        try:
            # Captured here: this machine's measured CPU ceilings apply too (io/ceilings.py).
            device = trace_device_spec(trace, this_machine=True)
            return analyze(trace, device, timing=stats, top=args.top, sort=args.sort,
                           artifact=artifact, notes=notes)
        except Exception as exc:  # noqa: BLE001 - reported in the notes, never hidden
            notes.append(f"analysis failed: {type(exc).__name__}: {exc}")
            return ProfileReport(timing=stats, trace=trace, artifact=artifact, notes=tuple(notes))

    def _name_cells(self, artifact: dict[str, Any]) -> None:
        """Store, with the trace, the execution number of each notebook cell its Python
        frames ran in (under gpuprof_nb's own key, which other tools ignore), so the report,
        and the trace saved and loaded again, names them `In [n]`."""
        from gpuprof_nb.analysis.sources import profiler_frame_file
        from gpuprof_nb.io.cells import KEY

        events = artifact.get("traceEvents")
        files = (profiler_frame_file(str(e.get("name", ""))) for e in events or ()
                 if isinstance(e, dict) and e.get("cat") == "python_function")
        cells = self._cells.cell_numbers(f for f in files if f)
        if cells:
            artifact[KEY] = {"cells": cells}


def _display_report(report: Any) -> None:
    """Display the report's own mimebundle. Straight to the display publisher: IPython's
    display() would also ask eight other formatters (PNG, LaTeX, ...) for representations
    the report does not have, about 40 us per cell. If building the bundle fails, display()
    shows that error as it does for any object."""
    from IPython.display import display, publish_display_data

    try:
        bundle = report._repr_mimebundle_()
    except Exception:  # noqa: BLE001 - display() reports it the usual way
        display(report)
        return
    data, metadata = bundle if isinstance(bundle, tuple) else (bundle, {})
    publish_display_data(data, metadata=metadata)


def _compare(baseline: Any, report: Any, name: str) -> Any:
    """Return the comparison of `report` with the --baseline report, or None (with the
    reason printed) when it cannot be made: the run's own report is shown either way."""
    from gpuprof_nb.analysis.compare import compare

    try:
        return compare(baseline, report, before_label=name, after_label="this run")
    except Exception as exc:  # noqa: BLE001 - shown to the user, not swallowed
        print(f"%%gpuprofile --baseline {name}: no comparison ({type(exc).__name__}: {exc})")
        return None


def _print_report(report: Any) -> None:
    """Print the report's text. If rendering it fails, print its repr and why instead: the
    cell has run, and the report stays stored under -o."""
    try:
        text = report.text()
    except Exception as exc:  # noqa: BLE001 - shown to the user, not swallowed
        text = (f"{report!r}\n(the report's text could not be rendered: "
                f"{type(exc).__name__}: {exc})")
    print(text)


def _block_note(number: int, auto: bool) -> str:
    from gpuprof_nb.render.units import fmt_num

    how = "chosen from a calibration block after the warm-up; --number sets it" if auto \
        else "--number"
    return (f"each timed sample is {fmt_num(number)} back-to-back runs ({how}); times are per "
            f"run: the sample's time / {fmt_num(number)}")


@functools.cache
def _cuda_available() -> bool:
    """Whether torch sees a CUDA device (asked once per process: the answer cannot change
    once torch has looked, and the call costs ~10 us per cell from cold caches)."""
    import torch

    return bool(torch.cuda.is_available())


def _cuda_sync() -> None:
    import torch

    torch.cuda.synchronize()


def _device_name(cuda: bool) -> str:
    if not cuda:
        return "cpu"
    import torch

    return str(torch.cuda.get_device_name())


def _notes(args: Any, cuda: bool) -> list[str]:
    notes = []
    if not cuda:
        notes.append("CPU mode: no CUDA device; times are host wall-clock (perf_counter_ns)")
    if args.once:
        if args.timing_only:
            notes.append("--once: the cell ran once; numbers include cold-start effects")
        else:
            notes.append(
                "--once: the cell ran once, under the profiler; numbers include cold-start "
                "effects and profiler overhead"
            )
    if args.timing_only:
        notes.append("--timing-only: no profiler trace was recorded")
    return notes


def _usage(parser: Any) -> str:
    """Return 'usage: %%gpuprofile [...]' (IPython's formatter writes reST: '::' and a single %)."""
    lines = [ln.strip() for ln in parser.format_usage().splitlines()]
    body = " ".join(ln for ln in lines if ln and ln != "::")
    if body.startswith("%") and not body.startswith("%%"):
        body = "%" + body
    return f"usage: {body}\n(`%%gpuprofile?` explains every option)"


def _check_sort_key(key: str) -> str | None:
    """Return why `key` is not a valid --sort key, or None when it is."""
    from gpuprof_nb.analysis.ops import SORT_KEYS

    if key in SORT_KEYS:
        return None
    return f"--sort {key!r} is not one of: {', '.join(sorted(SORT_KEYS))}"


def register(ipython: Any) -> None:
    """Register %%gpuprofile and %%memsnap with an IPython shell."""
    from gpuprof_nb.memsnap_magic import MemsnapMagics

    ipython.register_magics(GpuprofileMagics)
    ipython.register_magics(MemsnapMagics)

"""IPython glue: `%%gpuprofile` (and registering `%%memsnap`). Parse arguments, capture,
load, analyse, display, store. No analysis or formatting lives here."""

from __future__ import annotations

import dataclasses
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

TRACE_SOURCE = "%%gpuprofile cell"


@magics_class
class GpuprofileMagics(Magics):
    """The `%%gpuprofile` cell magic."""

    @magic_arguments()
    @argument("--warmup", type=int, default=1, metavar="N",
              help="unmeasured runs before timing (default 1)")
    @argument("--repeat", type=int, default=3, metavar="N",
              help="timed runs, without the profiler attached (default 3)")
    @argument("--once", action="store_true",
              help="run the cell exactly once (cells with side effects), timed and "
                   "profiled together; the numbers then include cold-start effects "
                   "(--warmup and --repeat are ignored)")
    @argument("--timing-only", action="store_true",
              help="time the cell (CUDA events on GPU) without running the profiler")
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
    @argument("-o", dest="output", default=None, metavar="NAME",
              help="store the ProfileReport in the variable NAME")
    @argument("--quiet", action="store_true", help="display nothing")
    @cell_magic
    def gpuprofile(self, line: str, cell: str) -> None:
        """Time and profile the cell: warm-up runs, timed runs (no profiler), then one run
        under torch.profiler; show where the time goes.

        Example::

            %%gpuprofile -o report --trace build/trace.json.gz
            loss = model(x).sum(); loss.backward(); opt.step()
        """
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame in user tracebacks
        args = self._parse(line)
        if not cell.strip():
            raise UsageError(
                "%%gpuprofile: the cell is empty; put the code to profile below the magic "
                "line, e.g. `%%gpuprofile` then `y = model(x)`"
            )
        try:
            import torch  # noqa: F401 - fail here, clearly, before anything runs

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
        code = self._compile(cell)
        cuda = _cuda_available()
        runner = _CellRunner(code, self._ip.user_ns)
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
                                         device_name=device_name,
                                         before_each=runner.restore_modes))

                try:
                    artifact = profile_cell(timed_once, runs=1, stack=args.stack,
                                            memory=args.memory, cuda=cuda)
                except ProfilerStoppedByCell as exc:
                    notes.append(f"no trace: {exc}")
                stats = dataclasses.replace(box[0], profiled=True)
            else:
                stats = time_cell(runner, warmup=args.warmup, repeat=args.repeat,
                                  once=args.once, sync=sync, use_cuda_events=cuda,
                                  device_name=device_name, before_each=runner.restore_modes)
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
        self._publish(self._report(stats, artifact, args, notes), args)

    def _publish(self, report: Any, args: Any) -> None:
        """Store the report under -o NAME and display it unless --quiet."""
        if args.output:
            self._ip.user_ns[args.output] = report
        if not args.quiet:
            from IPython.display import display

            display(report)

    def _publish_partial(self, stats: Any, notes: list[str], exc: BaseException,
                         args: Any) -> None:
        """Publish a timing-only report after the profiled run raised; never raise itself,
        so the user's exception is the one that propagates."""
        from gpuprof_nb.report import ProfileReport

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
        """Return the parsed options; every mistake becomes a UsageError with the usage."""
        parser = self.gpuprofile.parser
        try:
            args = parse_argstring(self.gpuprofile, line)
        except UsageError as exc:
            raise UsageError(f"%%gpuprofile: {exc}\n{_usage(parser)}") from None
        except ValueError as exc:  # unbalanced quotes in the option line
            raise UsageError(f"%%gpuprofile: {exc}\n{_usage(parser)}") from None
        problems = []
        if args.warmup < 0:
            problems.append(f"--warmup must be 0 or more, got {args.warmup}")
        if args.repeat < 1:
            problems.append(f"--repeat must be 1 or more, got {args.repeat}")
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

    def _compile(self, cell: str) -> Any:
        """Return the cell compiled as IPython would run it (line magics and `!` expanded);
        a SyntaxError propagates before anything runs. The source is cached under the
        code's file name so tracebacks show the user's lines."""
        source = self._ip.transform_cell(cell)
        filename = self._ip.compile.cache(source, self._ip.execution_count, raw_code=cell)
        return self._ip.compile(source, filename, "exec")

    def _report(self, stats: Any, artifact: Any, args: Any, notes: list[str]) -> Any:
        from gpuprof_nb.errors import GpuprofError
        from gpuprof_nb.report import (
            ProfileReport,
            analyze,
            count_steps_per_run,
            save_trace_dict,
        )

        if artifact is None:
            return ProfileReport(timing=stats, trace=None, notes=tuple(notes))
        from gpuprof_nb.io.trace import trace_from_dict

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
            return analyze(trace, timing=stats, top=args.top, sort=args.sort,
                           artifact=artifact, notes=notes)
        except Exception as exc:  # noqa: BLE001 - reported in the notes, never hidden
            notes.append(f"analysis failed: {type(exc).__name__}: {exc}")
            return ProfileReport(timing=stats, trace=trace, artifact=artifact, notes=tuple(notes))


class _CellRunner:
    """Runs the compiled cell in the user namespace. `restore_modes` puts back the grad and
    autocast modes found before the first run; the magic calls it before every run (outside
    the timed span), so a run that changed them (or raised half-way through a `with` block)
    does not change the next, and once more at the end."""

    def __init__(self, code: Any, namespace: dict[str, Any]) -> None:
        self.code = code
        self.namespace = namespace
        self.modes = _save_modes()

    def __call__(self) -> None:
        __tracebackhide__ = True  # noqa: F841
        exec(self.code, self.namespace)

    def restore_modes(self) -> None:
        _restore_modes(self.modes)


_AUTOCAST_DEVICES = ("cpu", "cuda")


def _save_modes() -> dict[str, Any]:
    import torch

    modes: dict[str, Any] = {"grad": torch.is_grad_enabled()}
    for dev in _AUTOCAST_DEVICES:
        try:
            modes[dev] = (torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
        except (RuntimeError, TypeError, AttributeError):
            continue
    return modes


def _restore_modes(modes: dict[str, Any]) -> None:
    import torch

    torch.set_grad_enabled(modes["grad"])
    for dev in _AUTOCAST_DEVICES:
        if dev in modes:
            enabled, dtype = modes[dev]
            torch.set_autocast_enabled(dev, enabled)
            torch.set_autocast_dtype(dev, dtype)


def _cuda_available() -> bool:
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

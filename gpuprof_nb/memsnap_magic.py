"""IPython glue for `%%memsnap`: parse arguments, record memory around the cell, analyse,
display, store. Recording and analysis live in capture/memory.py and analysis/memory.py."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from gpuprof_nb.capture.cell import CellCompiler

# Upper bounds (far past any real use), so a typo cannot run for ever or fill memory.
MAX_REPEAT = 10_000
MAX_ENTRIES = 100_000_000


def _count(value: int) -> str:
    return f"{value:,}" if value.bit_length() < 64 else f"a number of {len(str(value)):,} digits"


@magics_class
class MemsnapMagics(Magics):
    """The `%%memsnap` cell magic."""

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self._cells = CellCompiler(shell)

    @magic_arguments()
    @argument(
        "--max-entries",
        type=int,
        default=None,
        metavar="N",
        help="history entries the CUDA allocator keeps (default 200000; the oldest "
        "are dropped first)",
    )
    @argument(
        "--stacks",
        choices=("python", "all"),
        default="python",
        help="record Python frames only, or C++ frames too (slower; CUDA only)",
    )
    @argument(
        "--save",
        default=None,
        metavar="PATH",
        help="write the snapshot pickle here (PyTorch's memory_viz opens it)",
    )
    @argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run the cell N times, to see memory that grows from run to run",
    )
    @argument(
        "--window",
        default=None,
        metavar="START:END",
        help="analyse only this range: ms on CUDA and CPU (entries when the snapshot "
        "has no times); either side may be empty",
    )
    @argument(
        "--fit",
        default=None,
        metavar="VAR",
        help="predict the peak at other batch sizes: run the cell at VAR // 2 (a warm-up), "
        "record it there and at VAR (the batch-size variable the cell reads, set in an "
        "earlier cell)",
    )
    @argument(
        "--budget",
        default=None,
        metavar="SIZE",
        help="memory to fit in (e.g. 8GiB, 512MiB, 8GB): the largest batch and a "
        "checkpointing plan under it (default with --fit: the device's memory; on the "
        "CPU the RAM available now)",
    )
    @argument(
        "--apply",
        action="store_true",
        help="with --budget: apply the checkpointing plan for one more run, measure it, "
        "then take it off again",
    )
    @argument(
        "-o",
        dest="output",
        default=None,
        metavar="NAME",
        help="store the MemoryReport in the variable NAME",
    )
    @argument("--quiet", action="store_true", help="display nothing")
    @cell_magic
    def memsnap(self, line: str, cell: str) -> Any:
        """Record memory around the cell and show what used it: the timeline by allocation
        site, what was live at the peak, leaks, segments and findings. An out-of-memory
        error is reported, then raised again. A CUDA memory history you are already
        recording (torch.cuda.memory._record_memory_history) is read from the cell on and
        left running with its own settings.

        Will it fit: `--fit VAR` records the cell at VAR // 2 and VAR (the batch-size
        variable the cell reads) and predicts the peak at other batch sizes; `--budget`
        adds the largest batch and a checkpointing plan under it; `--apply` measures the
        plan (docs/fit.md).

        Example::

            %%memsnap --repeat 3 -o mem --save build/snapshot.pickle
            loss = model(x).sum(); loss.backward(); opt.step()

            %%memsnap --fit batch_size --budget 40GiB -o mem
            loss_fn(model(make_batch(batch_size)), y).backward(); opt.step()
        """
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame in user tracebacks
        args = self._parse(line)
        if not cell.strip():
            raise UsageError(
                "%%memsnap: the cell is empty; put the code to record below the magic line"
            )
        try:
            import torch  # noqa: F401 - fail here, clearly, before anything runs
        except ImportError as exc:
            raise UsageError(f"%%memsnap needs PyTorch ({exc}); pip install torch") from exc
        from gpuprof_nb.analysis.memory import parse_window
        from gpuprof_nb.capture.cell import CellRunner
        from gpuprof_nb.capture.memory import DEFAULT_MAX_ENTRIES, record_memory

        budget = None
        if args.budget is not None:
            from gpuprof_nb.results.fit import parse_bytes

            try:
                budget = parse_bytes(args.budget)
            except ValueError as e:
                raise UsageError(f"%%memsnap --budget: {e}") from None
        window = None
        if args.window is not None:
            try:
                window = parse_window(args.window)
            except ValueError as e:
                raise UsageError(f"%%memsnap --window: {e}") from None
        code, source = self._cells.compile(cell)
        namespace = self._shell().user_ns
        if args.fit:
            from gpuprof_nb.capture.batches import check_batch_variable

            try:
                check_batch_variable(source, args.fit, namespace)
            except ValueError as e:
                raise UsageError(f"%%memsnap --fit: {e}") from None
        runner = CellRunner(code, namespace)

        def run() -> None:
            __tracebackhide__ = True  # noqa: F841
            runner.restore_modes()
            runner()

        options = {
            "max_entries": args.max_entries or DEFAULT_MAX_ENTRIES,
            "stacks": args.stacks,
            "cell_code": code,
        }
        other = None
        try:
            if args.fit:
                from gpuprof_nb.capture.batches import record_batch_sizes

                runs = record_batch_sizes(run, namespace, args.fit, **options)
                capture, other = runs.main, runs
            else:
                capture = record_memory(run, repeat=args.repeat, namespace=namespace, **options)
        finally:
            runner.restore_modes()
        try:
            report = self._report(capture, window)
            # After an out-of-memory error the report is about that error, not a fit.
            if (args.fit or budget is not None) and capture.oom is None:
                from gpuprof_nb.memsnap_fit import fitted_report

                report = fitted_report(
                    report,
                    capture,
                    other,
                    budget,
                    variable=args.fit or "",
                    apply=args.apply,
                    run=run,
                    namespace=namespace,
                    options=options,
                )
            # Stored and shown first: if saving fails below, the report is not lost.
            if args.output:
                namespace[args.output] = report
            if not args.quiet:
                from IPython.display import display

                display(report)
            if args.save:
                self._save(capture, report, args.save, args.quiet, args.output)
        finally:
            # The user's out-of-memory error is what propagates, whatever happened above.
            if capture.oom is not None:
                raise capture.oom
        return None

    def _parse(self, line: str) -> Any:
        try:
            args = parse_argstring(self.memsnap, line)
        except UsageError as e:
            raise UsageError(f"%%memsnap: {e}") from None
        from gpuprof_nb.capture.options import name_problem, output_path_problem

        if not 1 <= args.repeat <= MAX_REPEAT:
            raise UsageError(
                f"%%memsnap --repeat must be at least 1 and at most {MAX_REPEAT:,}, got "
                f"{_count(args.repeat)}"
            )
        if args.max_entries is not None and not 1 <= args.max_entries <= MAX_ENTRIES:
            raise UsageError(
                f"%%memsnap --max-entries must be at least 1 and at most {MAX_ENTRIES:,}, got "
                f"{_count(args.max_entries)}"
            )
        if args.output is not None:
            problem = name_problem(args.output, "-o")
            if problem:
                raise UsageError(f"%%memsnap {problem}")
        if args.save:
            # Before the cell runs, like --trace: a path that cannot be written is said now.
            problem = output_path_problem(args.save, "--save")
            if problem:
                raise UsageError(f"%%memsnap {problem}")
        if args.fit is not None:
            # `--fit ''` was taken as no --fit at all, and `--fit class` as a variable.
            problem = name_problem(args.fit, "--fit")
            if problem:
                raise UsageError(f"%%memsnap {problem}")
        if args.fit is not None and args.repeat > 1:
            raise UsageError("%%memsnap --fit records the cell once per batch size; drop --repeat")
        if args.apply and args.budget is None:
            raise UsageError("%%memsnap --apply applies the plan made under --budget; give one")
        return args

    def _shell(self) -> Any:
        """The shell this magic is registered with (Magics types it as optional)."""
        if self.shell is None:
            raise UsageError("%%memsnap runs inside an IPython shell or Jupyter kernel")
        return self.shell

    def _report(self, capture: Any, window: Any) -> Any:
        import dataclasses

        from gpuprof_nb.analysis.report import analyze_memory
        from gpuprof_nb.io.cells import KEY
        from gpuprof_nb.io.snapshot import snapshot_from_dict

        snapshot = snapshot_from_dict(capture.snapshot, where="%%memsnap")
        # The execution number of each notebook cell the stacks ran in, so sites read
        # `In [n], line L`; kept in the raw dict too, so a saved snapshot keeps them.
        cells = self._cells.cell_numbers(f.filename for f in snapshot.frames)
        if cells:
            snapshot = dataclasses.replace(snapshot, cells=cells)
            extra = capture.snapshot.setdefault(KEY, {})
            if isinstance(extra, dict):
                extra["cells"] = cells
        if capture.source == "cuda":
            # Capture notes (e.g. a full --max-entries buffer) always reach the report.
            snapshot = dataclasses.replace(snapshot, notes=snapshot.notes + capture.notes)
            if capture.step_starts:
                starts = [()] * (capture.device + 1)
                starts[capture.device] = capture.step_starts
                snapshot = dataclasses.replace(snapshot, step_starts=tuple(starts))
                # Kept in the raw dict too, so a saved --repeat snapshot still has its runs
                # (without them, a leak across runs reads as one run's growth offline).
                extra = capture.snapshot.setdefault(KEY, {})
                if isinstance(extra, dict):
                    extra["step_starts"] = [list(s) for s in starts]
        device = capture.device if capture.device in snapshot.devices else None
        oom = f"{type(capture.oom).__name__}: {capture.oom}" if capture.oom else None
        return analyze_memory(
            snapshot,
            device=device,
            window=window,
            step_starts=capture.step_starts or None,
            oom_message=oom,
        )

    @staticmethod
    def _save(capture: Any, report: Any, path: str, quiet: bool, output: str | None = None) -> None:
        from gpuprof_nb.errors import GpuprofError
        from gpuprof_nb.io.snapshot import save_snapshot

        kept = (
            f"the report is stored in `{output}`: save it with `{output}.save(path)`"
            if output
            else "the report is shown above (run with -o NAME to keep it, then NAME.save(path))"
        )
        try:
            # On CUDA the allocator's own dict is written as is (plus gpuprof_nb's own key,
            # which PyTorch's memory_viz ignores), as torch.cuda.memory._dump_snapshot
            # writes it; the CPU fallback writes the rebuilt one.
            out = save_snapshot(
                capture.snapshot if capture.source == "cuda" else report.snapshot, path
            )
        except (OSError, GpuprofError) as e:
            raise UsageError(f"%%memsnap --save: cannot write {path!r} ({e}); {kept}") from None
        if capture.source != "cuda" and not quiet:
            print(
                f"%%memsnap: saved the CPU fallback snapshot to {out} (rebuilt from "
                "profiler memory events; no CUDA allocator segments)"
            )

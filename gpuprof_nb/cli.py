"""The `gpuprof` command line (also `python -m gpuprof_nb`): the notebook's reports and its
before/after verdict outside the notebook, for scripts and CI jobs.

    gpuprof report TRACE|SNAPSHOT|DIR... [-o report.html|.md|.json|.txt]
    gpuprof compare BEFORE AFTER [--fail-on slower|any] [--threshold 20%]
    gpuprof compare --baseline NAME AFTER
    gpuprof baseline save NAME TRACE | list | show NAME

Exit codes: 0 no regression, 1 regression, 2 bad input (one line on stderr, no traceback),
3 the noise covers the difference (retry, or take more samples). Glue only: parsing, reading
files through the session (session/files.py, session/distributed.py, session/baselines.py), and
printing what the render layer writes.
"""

from __future__ import annotations

import argparse
import html
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.model.arguments import describe
from gpuprof_nb.results.gate import EXIT_INPUT_ERROR, EXIT_NOISY, EXIT_PASS, EXIT_REGRESSION

PROG = "gpuprof"
FORMATS = ("text", "html", "md", "json")
_SUFFIXES = {".html": "html", ".htm": "html", ".md": "md", ".json": "json", ".txt": "text"}

DESCRIPTION = """\
Profile reports and a before/after regression gate for PyTorch, outside the notebook:
the same reports and the same noise-aware verdict as %%gpuprofile and gpuprof_nb.compare.

commands:
  report     show a trace, a memory snapshot, or a distributed run's traces
  compare    before and after: the verdict, and an exit code a CI job can gate on
  baseline   save, list and show named baselines (.gpuprof/baselines/ by default)

exit codes:
  0  no regression (or a report written)
  1  regression: after is slower beyond the threshold
  2  bad input: a missing or unreadable file, an unknown baseline, a bad option
  3  the noise covers the difference: neither a pass nor a regression; run again

examples:
  gpuprof report trace.json.gz -o report.html
  gpuprof report runs/ --workers 4 -o run.md
  gpuprof compare before.json.gz after.json.gz
  gpuprof baseline save main build/trace.json.gz
  gpuprof compare --baseline main build/trace.json.gz --threshold 10%
"""

COMPARE_EPILOG = """\
The verdict (docs/compare.md): the ratio of median times, after over before, with a 95%
bootstrap interval. Its samples are the timed runs of saved %%gpuprofile reports (report.save()
keeps them with the trace), else the profiled steps (ProfilerStep#N) of each trace. A change
is called only when the whole interval lies beyond the threshold; an interval that reaches
past it is "noisy" (exit 3). Traces of one profiled window a side have no samples: their
ratio is judged against the threshold, and against the 20%% a single window can drift.

Lower the threshold only on a quiet, dedicated machine: two runs of the same code on a
shared one can differ by 10-20%%.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake said in one line (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INPUT_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _fraction(text: str) -> float:
    """Parse a threshold: '5%', '0.05' or '5 %' -> 0.05."""
    raw = text.strip()
    try:
        value = float(raw[:-1].strip()) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a threshold like 5% or 0.05") from None
    from gpuprof_nb.session.analyze import check_threshold

    try:
        return check_threshold(value)
    except GpuprofError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _whole(text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{describe(text)} is not a whole number") from None
    if not low <= value <= high:
        shown = f"{value:,}" if value.bit_length() < 64 else f"a number of {len(text):,} digits"
        raise argparse.ArgumentTypeError(f"{shown}: give {low} to {high:,}")
    return value


def _workers(text: str) -> int:
    return _whole(text, 1, 1024)


# Rows in the top-ops table: the magic's --top bound (capture/options.py MAX_TOP).
MAX_TOP = 100_000


def _top(text: str) -> int:
    return _whole(text, 1, MAX_TOP)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress on stderr (there is none anyway when stderr is not a terminal)",
    )


def _output_options(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help=f"write the {what} here instead of printing it: standalone .html (the "
        "notebook's HTML in a page), .md (Markdown for a PR comment), .json (the export "
        "schema, docs/exports.md) or .txt",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        help="the format, when PATH's suffix does not say or when printing (default: text)",
    )


def _baselines_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--baselines",
        metavar="DIR",
        help="where baselines live (default: $GPUPROF_BASELINES, else .gpuprof/baselines)",
    )


def build_parser() -> argparse.ArgumentParser:
    """Return the `gpuprof` parser (its --help is the command line's documentation)."""
    from gpuprof_nb.version import __version__

    parser = _Parser(
        prog=PROG,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuprof_nb {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_report(commands)
    _add_compare(commands)
    _add_baseline(commands)
    return parser


def _add_report(commands: argparse._SubParsersAction[_Parser]) -> None:
    """Add `gpuprof report`."""
    report = commands.add_parser(
        "report",
        help="the report of a trace, a snapshot, or a run's rank traces",
        description="Write the notebook's report of a torch.profiler trace (.json, .json.gz), "
        "a CUDA memory snapshot (.pickle), or, for several traces or a directory of them, "
        "the distributed run's report (one trace per rank, read in parallel).",
    )
    report.add_argument(
        "sources", nargs="+", metavar="TRACE|SNAPSHOT|DIR", help="what to report on"
    )
    _output_options(report, "report")
    fan = report.add_mutually_exclusive_group()
    fan.add_argument(
        "--workers",
        type=_workers,
        metavar="N",
        help="read a run's ranks in N local worker processes (default: one per core)",
    )
    fan.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="read a run's ranks on a Dask cluster (tcp://host:8786; needs the "
        "gpuprof_nb[distributed] extra)",
    )
    report.add_argument(
        "--top", type=_top, default=20, metavar="N", help="rows in the top-ops table"
    )
    _common(report)


def _add_compare(commands: argparse._SubParsersAction[_Parser]) -> None:
    """Add `gpuprof compare`."""
    compare = commands.add_parser(
        "compare",
        help="before and after: the verdict and a CI exit code",
        description="Compare two traces (or a named baseline and a trace) and print the "
        "notebook's comparison: the verdict on the time per step (or per run), what "
        "changed most, the idle breakdown and the findings; then one line saying PASS, "
        "REGRESSION or NOISY, whose exit code is 0, 1 or 3.",
        epilog=COMPARE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    compare.add_argument(
        "sides", nargs="+", metavar="TRACE", help="BEFORE AFTER, or AFTER with --baseline"
    )
    compare.add_argument("--baseline", metavar="NAME", help="compare AFTER with this baseline")
    _baselines_option(compare)
    compare.add_argument(
        "--fail-on",
        choices=("slower", "any"),
        default="slower",
        help="slower (default): exit 1 only when after is slower; any: also when it is "
        "clearly faster (the baseline is out of date)",
    )
    compare.add_argument(
        "--threshold",
        type=_fraction,
        default=None,
        metavar="FRACTION",
        help="the change called real: 5%% or 0.05 (default: the library's noise floor, 20%%)",
    )
    _output_options(compare, "comparison")
    _common(compare)


def _add_baseline(commands: argparse._SubParsersAction[_Parser]) -> None:
    """Add `gpuprof baseline` and its actions save, list and show."""
    baseline = commands.add_parser(
        "baseline",
        help="save, list or show named baselines",
        description="Named baselines: readable files holding what the verdict needs (timed "
        "samples or profiled steps, and a copy of the trace), in .gpuprof/baselines/ "
        "unless --baselines DIR or $GPUPROF_BASELINES says otherwise.",
    )
    actions = baseline.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    save = actions.add_parser(
        "save",
        help="save a trace as the baseline NAME (replacing one of that name)",
        description="Save TRACE as the baseline NAME. A trace that report.save() or "
        "%%gpuprofile --trace wrote keeps its timed samples; a plain torch.profiler trace "
        "is judged on its profiled steps.",
    )
    save.add_argument("name", metavar="NAME")
    save.add_argument("trace", metavar="TRACE")
    _baselines_option(save)
    _common(save)
    listing = actions.add_parser("list", help="list the saved baselines")
    _baselines_option(listing)
    show = actions.add_parser("show", help="print a baseline's record (JSON)")
    show.add_argument("name", metavar="NAME")
    _baselines_option(show)


def _format(args: argparse.Namespace) -> str:
    if args.format:
        return str(args.format)
    if args.output:
        suffix = Path(args.output).suffix.lower()
        if suffix not in _SUFFIXES:
            raise GpuprofError(
                f"-o {args.output}: cannot tell the format from {suffix or 'no suffix'!r}; "
                "use .html, .md, .json or .txt, or say --format"
            )
        return _SUFFIXES[suffix]
    return "text"


def standalone_html(result: Any, title: str) -> str:
    """Return the notebook's HTML of `result` (its mimebundle's text/html) as a page."""
    body = result._repr_mimebundle_(include=["text/html"])["text/html"]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def _render(result: Any, fmt: str, title: str) -> str:
    if fmt == "html":
        return standalone_html(result, title)
    if fmt == "md":
        return str(result.to_markdown())
    if fmt == "json":
        return str(result.to_json())
    return str(result.text()) + "\n"


def _emit(result: Any, args: argparse.Namespace, title: str, out: TextIO) -> None:
    fmt = _format(args)
    text = _render(result, fmt, title)
    if args.output:
        from gpuprof_nb.results.exports import write_export

        target = write_export(text, args.output, f"the {fmt} output")
        if not args.quiet:
            print(f"gpuprof: wrote {target}", file=sys.stderr)
    else:
        out.write(text)


def _size(path: str) -> str:
    from gpuprof_nb.render.units import fmt_bytes

    try:
        return fmt_bytes(os.path.getsize(path))
    except OSError:
        return "?"


def _executor(args: argparse.Namespace) -> tuple[Any, Any]:
    """Return (executor, what to close after) for a run's ranks: a Dask cluster's executor
    (--scheduler), a local pool of --workers processes, or (None, None): analyze_run's own
    pool."""
    if args.scheduler:
        try:
            from distributed import Client
        except ImportError:
            raise GpuprofError(
                "--scheduler needs Dask: pip install 'gpuprof_nb[distributed]'"
            ) from None
        try:
            client = Client(args.scheduler, timeout=30)  # type: ignore[no-untyped-call]
        except (OSError, ValueError, TypeError) as exc:
            raise GpuprofError(f"--scheduler {args.scheduler}: cannot connect ({exc})") from None
        # distributed is untyped: its executor is a concurrent.futures.Executor
        return client.get_executor(), client.close  # type: ignore[no-untyped-call]
    if args.workers:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(
            max_workers=args.workers, mp_context=multiprocessing.get_context("spawn")
        )
        return pool, pool.shutdown
    return None, None


def _report(args: argparse.Namespace, out: TextIO) -> int:
    from gpuprof_nb.render.terminal import Activity, TerminalProgress
    from gpuprof_nb.session.files import file_kind

    sources: list[str] = list(args.sources)
    kinds = [file_kind(s) for s in sources]
    if len(sources) == 1 and kinds[0] != "directory":
        source = sources[0]
        from gpuprof_nb.session.analyze import analyze, analyze_memory
        from gpuprof_nb.session.files import load_snapshot, load_trace

        if kinds[0] == "snapshot":
            with Activity(f"loading {source} ({_size(source)})", enabled=not args.quiet):
                snapshot = load_snapshot(source)
            with Activity("analysing", enabled=not args.quiet):
                result: Any = analyze_memory(snapshot)
            _emit(result, args, f"gpuprof_nb memory report: {Path(source).name}", out)
            return EXIT_PASS
        with Activity(f"loading {source} ({_size(source)})", enabled=not args.quiet):
            trace = load_trace(source)
        with Activity("analysing", enabled=not args.quiet):
            result = analyze(trace, top=args.top)
        _emit(result, args, f"gpuprof_nb profile: {Path(source).name}", out)
        return EXIT_PASS
    if "snapshot" in kinds:
        bad = sources[kinds.index("snapshot")]
        raise GpuprofError(
            f"{bad}: a memory snapshot among a run's traces; report on it alone "
            f"(`gpuprof report {bad}`)"
        )
    if len(sources) > 1 and "directory" in kinds:
        raise GpuprofError("give one directory of rank traces, or several trace files, not both")
    from gpuprof_nb.session.distributed import _sources, analyze_run

    items = _sources(sources[0] if len(sources) == 1 else sources)
    executor, close = _executor(args)
    bar = TerminalProgress(len(items), enabled=not args.quiet, what="ranks", unit="ranks")
    try:
        run = analyze_run(items, executor=executor, progress=bar)
    finally:
        if close is not None:
            close()
    if run.ranks == () and run.failures:
        raise GpuprofError(f"no rank could be read: {run.failures[0]}")
    _emit(run, args, "gpuprof_nb distributed run", out)
    return EXIT_PASS


def _compare(args: argparse.Namespace, out: TextIO) -> int:
    from gpuprof_nb.render.terminal import Activity
    from gpuprof_nb.results.compare import COMPARE_NOISE_FLOOR
    from gpuprof_nb.session.analyze import compare, regression_gate
    from gpuprof_nb.session.files import load_trace_report

    sides: list[str] = list(args.sides)
    if args.baseline is not None:
        from gpuprof_nb.session.baselines import load_baseline

        if len(sides) != 1:
            raise GpuprofError(
                f"--baseline {args.baseline} compares one trace with it; got {len(sides)}"
            )
        with Activity(f"loading baseline {args.baseline}", enabled=not args.quiet):
            before = load_baseline(args.baseline, args.baselines)
        before_label = f"baseline {args.baseline}"
    else:
        if len(sides) != 2:
            raise GpuprofError(
                f"compare takes BEFORE AFTER (or --baseline NAME AFTER); got {len(sides)} paths"
            )
        with Activity(f"loading {sides[0]} ({_size(sides[0])})", enabled=not args.quiet):
            before = load_trace_report(sides[0], "BEFORE")
        before_label = Path(sides[0]).name
    after_path = sides[-1]
    with Activity(f"loading {after_path} ({_size(after_path)})", enabled=not args.quiet):
        after = load_trace_report(after_path, "AFTER")
    threshold = args.threshold if args.threshold is not None else COMPARE_NOISE_FLOOR
    after_label = Path(after_path).name
    if after_label == before_label:
        before_label, after_label = f"before ({before_label})", f"after ({after_label})"
    comparison = compare(
        before,
        after,
        before_label=before_label,
        after_label=after_label,
        noise_floor=threshold,
    )
    gate = regression_gate(comparison, fail_on=args.fail_on, threshold=threshold)
    _emit(comparison, args, "gpuprof_nb before and after", out)
    out.write(gate.line() + "\n")
    return gate.exit_code


def _baseline(args: argparse.Namespace, out: TextIO) -> int:
    import json

    from gpuprof_nb.session import baselines

    if args.action == "save":
        from gpuprof_nb.render.terminal import Activity

        with Activity(f"saving baseline {args.name}", enabled=not args.quiet):
            path = baselines.save_baseline(args.name, args.trace, directory=args.baselines)
        record = baselines.baseline_info(args.name, args.baselines)
        samples = len(record.get("samples_us") or [])
        what = f"{samples} {record.get('samples_from')}" if samples else "one profiled window"
        out.write(f"gpuprof: saved baseline {args.name} ({what}) in {path}\n")
        return EXIT_PASS
    if args.action == "list":
        where = baselines.baseline_directory(args.baselines)
        names = baselines.baseline_names(where)
        if not names:
            out.write(f"no baselines in {where}\n")
        for name in names:
            try:
                record = baselines.baseline_info(name, where)
            except GpuprofError as exc:
                out.write(f"{name}\t(unreadable: {exc})\n")
                continue
            out.write(
                f"{name}\t{record.get('saved_at', '?')}\t{record.get('samples_from') or 'window'}"
                f"\t{record.get('source', '')}\n"
            )
        return EXIT_PASS
    if args.action == "show":
        record = baselines.baseline_info(args.name, args.baselines)
        out.write(json.dumps(record, indent=2) + "\n")
        return EXIT_PASS
    raise GpuprofError("baseline needs an action: save, list or show (see gpuprof baseline -h)")


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run the command line and return its exit code (0 pass, 1 regression, 2 bad input,
    3 noisy). A GpuprofError, or any other failure, is one line on stderr, never a
    traceback (set GPUPROF_DEBUG=1 to see one)."""
    stream = out if out is not None else sys.stdout
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(stream)
        return EXIT_INPUT_ERROR
    run = {"report": _report, "compare": _compare, "baseline": _baseline}[args.command]
    try:
        if getattr(args, "output", None):
            # Before the files are read (minutes on a large trace): a path that cannot be
            # written (a FIFO, a directory, a folder that is a file) is said now.
            from gpuprof_nb.io.guards import check_writable

            _format(args)
            check_writable(args.output, what="-o's output", error=GpuprofError)
        return run(args, stream)
    except GpuprofError as exc:
        message = str(exc).replace("\n", " ")
        print(f"{PROG} {args.command}: error: {message}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback (GPUPROF_DEBUG shows it)
        if os.environ.get("GPUPROF_DEBUG"):
            raise
        message = str(exc).replace("\n", " ")[:500]
        print(
            f"{PROG} {args.command}: error: {type(exc).__name__}: {message} (an unexpected "
            "failure: GPUPROF_DEBUG=1 shows where; please report it)",
            file=sys.stderr,
        )
        return EXIT_INPUT_ERROR


def entry() -> NoReturn:
    """The console script's entry point."""
    sys.exit(main())


__all__ = ["EXIT_INPUT_ERROR", "EXIT_NOISY", "EXIT_PASS", "EXIT_REGRESSION", "main"]

"""The magics' option lines: every option of `%%gpuprofile` and `%%memsnap` declared once
(flags, argparse settings, help) in the order `%%gpuprofile?` and `%%memsnap?` list them,
and a line parsed into the session's frozen options (session/profile.py: ProfileOptions,
session/memsnap.py: MemsnapOptions) plus what the magic itself does with the report
(`Publish`: -o, --quiet, --baseline, --save). Every mistake is one UsageError saying what
is wrong, checked before the cell runs.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from gpuprof_nb.capture.cell import remember
from gpuprof_nb.errors import OptionError
from gpuprof_nb.session.files import writable_problem
from gpuprof_nb.session.options import MemsnapOptions, ProfileOptions, parse_bytes, parse_window

if TYPE_CHECKING:
    from gpuprof_nb.results.report import ProfileReport
Option = tuple[tuple[str, ...], dict[str, Any]]
Magic = Callable[..., Any]


def _option(*flags: str, **settings: Any) -> Option:
    return flags, settings


GPUPROFILE_OPTIONS: tuple[Option, ...] = (
    _option(
        "--warmup",
        type=int,
        default=None,
        metavar="N",
        help="unmeasured runs before timing (default: at least 1, and more while "
        "they add up to under 5 ms, so a short cell reaches its steady pace "
        "before it is timed; a cell of 5 ms or more warms up once)",
    ),
    _option(
        "--repeat",
        type=int,
        default=3,
        metavar="N",
        help="timed samples, without the profiler attached (default 3); a sample "
        "is one run, or a block of --number back-to-back runs for short cells",
    ),
    _option(
        "--number",
        type=int,
        default=None,
        metavar="K",
        help="runs per timed sample; times are shown per run (block time / K). "
        "Default: chosen like timeit does: a cell faster than 0.5 ms per run "
        "(going by the warm-up, or by the first timed run, then not kept, when "
        "the warm-up was a slow cold start) runs one untimed calibration block, "
        "then samples of K back-to-back runs lasting about 1 ms, so clock reads "
        "and call overhead vanish from the per-run time; slower cells, --warmup "
        "0 and cells that change grad/autocast mode run once per sample. "
        "--number 1 --warmup N: the cell runs exactly N + --repeat (+ 1 profiled) "
        "times",
    ),
    _option(
        "--once",
        action="store_true",
        help="run the cell exactly once (cells with side effects), timed and "
        "profiled together; the numbers then include cold-start effects "
        "(--warmup and --repeat are ignored)",
    ),
    _option(
        "--timing-only",
        action="store_true",
        help="time the cell (CUDA events on GPU) without running the profiler; the "
        "summary is printed as text, like %%timeit (-o NAME keeps the report, "
        "whose display is the HTML summary)",
    ),
    _option("--stack", action="store_true", help="record Python call stacks"),
    _option("--memory", action="store_true", help="record allocator events"),
    # What the ranges cost a module call and a training step: benchmarks/RESULTS.md, section 13.
    _option(
        "--no-modules",
        dest="modules",
        action="store_false",
        help="do not record nn.Module ranges in the profiled run (they add a small cost to "
        "each module call; the Modules tab then has nothing to show)",
    ),
    _option(
        "--top", type=int, default=20, metavar="N", help="rows in the top-ops table (default 20)"
    ),
    _option(
        "--sort",
        default=None,
        metavar="KEY",
        help="order of the top-ops table: self_device_us, total_device_us, "
        "self_cpu_us, total_cpu_us or calls (key_averages names such as "
        "self_cuda_time_total work too); default: self device time on GPU, "
        "self CPU time on CPU",
    ),
    _option(
        "--trace",
        default=None,
        metavar="PATH",
        help="also write the Chrome/Perfetto trace JSON here (gzip if PATH ends in .gz)",
    ),
    _option(
        "--baseline",
        default=None,
        metavar="NAME",
        help="compare this run with the report stored in the variable NAME (an "
        "earlier %%gpuprofile -o NAME) and show the comparison first: faster, "
        "slower or no clear change, and what changed; with --timing-only, the "
        "verdict alone",
    ),
    _option(
        "-o",
        dest="output",
        default=None,
        metavar="NAME",
        help="store the ProfileReport in the variable NAME",
    ),
    _option("--quiet", action="store_true", help="display nothing"),
)


MEMSNAP_OPTIONS: tuple[Option, ...] = (
    _option(
        "--max-entries",
        type=int,
        default=None,
        metavar="N",
        help="history entries the CUDA allocator keeps (default 200000; the oldest "
        "are dropped first)",
    ),
    _option(
        "--stacks",
        choices=("python", "all"),
        default="python",
        help="record Python frames only, or C++ frames too (slower; CUDA only)",
    ),
    _option(
        "--save",
        default=None,
        metavar="PATH",
        help="write the snapshot pickle here (PyTorch's memory_viz opens it)",
    ),
    _option(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run the cell N times, to see memory that grows from run to run",
    ),
    _option(
        "--window",
        default=None,
        metavar="START:END",
        help="analyse only this range: ms on CUDA and CPU (entries when the snapshot "
        "has no times); either side may be empty",
    ),
    _option(
        "--fit",
        default=None,
        metavar="VAR",
        help="predict the peak at other batch sizes: run the cell at VAR // 2 (a warm-up), "
        "record it there and at VAR (the batch-size variable the cell reads, set in an "
        "earlier cell)",
    ),
    _option(
        "--budget",
        default=None,
        metavar="SIZE",
        help="memory to fit in (e.g. 8GiB, 512MiB, 8GB): the largest batch and a "
        "checkpointing plan under it (default with --fit: the device's memory; on the "
        "CPU the RAM available now)",
    ),
    _option(
        "--apply",
        action="store_true",
        help="with --budget: apply the checkpointing plan for one more run, measure it, "
        "then take it off again",
    ),
    _option(
        "-o",
        dest="output",
        default=None,
        metavar="NAME",
        help="store the MemoryReport in the variable NAME",
    ),
    _option("--quiet", action="store_true", help="display nothing"),
)


def with_options(options: tuple[Option, ...]) -> Callable[[Magic], Any]:
    """Declare `options` on a magic as IPython's @magic_arguments and @argument decorators
    would: they build its parser (the magic's `parser` attribute) and its `?` help."""

    def declare(magic: Magic) -> Any:
        for flags, settings in reversed(options):
            magic = argument(*flags, **settings)(magic)
        return magic_arguments()(magic)

    return declare


@dataclass(frozen=True, slots=True)
class Publish:
    """What the magic does with the report: store it under `output` (-o), show it unless
    `quiet`, compare it with the report stored under `baseline` (%%gpuprofile --baseline),
    write its snapshot to `save` (%%memsnap --save)."""

    output: str | None = None
    quiet: bool = False
    baseline: str | None = None
    save: str | None = None


class OptionLines:
    """Parses `%%gpuprofile` option lines with the magic's parser (IPython's, built from
    GPUPROFILE_OPTIONS) into ProfileOptions and Publish; a line parsed before comes from a
    cache (parsing with argparse is a cost paid by every cell: benchmarks/RESULTS.md,
    "Measurements behind design choices", M14; the options are frozen)."""

    def __init__(self, parser: Any) -> None:
        self.parser = parser
        # A bad line is never cached: it is refused every time.
        self._cache: dict[str, tuple[ProfileOptions, Publish]] = {}

    def parse(self, line: str) -> tuple[ProfileOptions, Publish]:
        """Return the parsed options; every mistake becomes a UsageError with the usage."""
        parsed = self._cache.get(line)
        if parsed is None:
            parsed = self._parse_uncached(line)
            remember(self._cache, line, parsed)
        return parsed

    def _parse_uncached(self, line: str) -> tuple[ProfileOptions, Publish]:
        try:
            args = self.parser.parse_argstring(line)
        except UsageError as exc:
            raise UsageError(f"%%gpuprofile: {exc}\n{self.usage()}") from None
        except ValueError as exc:  # unbalanced quotes in the option line
            raise UsageError(f"%%gpuprofile: {exc}\n{self.usage()}") from None
        options = ProfileOptions(
            warmup=args.warmup,
            repeat=args.repeat,
            number=args.number,
            once=args.once,
            timing_only=args.timing_only,
            stack=args.stack,
            memory=args.memory,
            modules=args.modules,
            top=args.top,
            sort=args.sort,
            trace_path=args.trace,
        )
        publish = Publish(output=args.output, quiet=args.quiet, baseline=args.baseline)
        problems = options.problems()
        if publish.output is not None:
            problem = name_problem(publish.output, "-o")
            if problem:
                problems.append(problem)
        if problems:
            raise UsageError("%%gpuprofile: " + "; ".join(problems) + "\n" + self.usage())
        return options, publish

    def usage(self) -> str:
        """Return 'usage: %%gpuprofile [...]' (IPython's formatter writes reST: '::' and a
        single %)."""
        lines = [ln.strip() for ln in self.parser.format_usage().splitlines()]
        body = " ".join(ln for ln in lines if ln and ln != "::")
        if body.startswith("%") and not body.startswith("%%"):
            body = "%" + body
        return f"usage: {body}\n(`%%gpuprofile?` explains every option)"


def memsnap_options(parser: Any, line: str) -> tuple[MemsnapOptions, Publish]:
    """Return a `%%memsnap` line parsed and checked; every mistake is a UsageError."""
    try:
        args = parser.parse_argstring(line)
    except UsageError as e:
        raise UsageError(f"%%memsnap: {e}") from None
    budget = window = None
    if args.budget is not None:
        try:
            budget = parse_bytes(args.budget)
        except ValueError as e:
            raise UsageError(f"%%memsnap --budget: {e}") from None
    if args.window is not None:
        try:
            window = parse_window(args.window)
        except ValueError as e:
            raise UsageError(f"%%memsnap --window: {e}") from None
    stacks: Literal["python", "all"] = "all" if args.stacks == "all" else "python"
    options = MemsnapOptions(
        max_entries=args.max_entries,
        stacks=stacks,
        repeat=args.repeat,
        window=window,
        fit=args.fit,
        budget_bytes=budget,
        apply=args.apply,
    )
    publish = Publish(output=args.output, quiet=args.quiet, save=args.save)
    problems = options.problems()
    if publish.output is not None:
        problems.append(name_problem(publish.output, "-o") or "")
    if publish.save:
        # Before the cell runs, like --trace: a path that cannot be written is said now.
        problems.append(writable_problem(publish.save, "--save") or "")
    if options.fit is not None:
        # `--fit ''` was taken as no --fit at all, and `--fit class` as a variable.
        problems.append(name_problem(options.fit, "--fit") or "")
    problems = [p for p in problems if p]
    if problems:
        raise UsageError(f"%%memsnap {problems[0]}")
    return options, publish


def option_error(magic: str, exc: OptionError) -> UsageError:
    """Return the UsageError a magic raises for an option the session refused."""
    return UsageError(f"%%{magic} {exc}" if exc.option else f"%%{magic}: {exc}")


def name_problem(name: str, flag: str) -> str | None:
    """Return why `name` cannot name a variable for `flag` (-o, --baseline), or None: it
    must be an identifier and not a keyword (`None`, `class`, `True`, `lambda` ...), which no
    code could read back."""
    if not name.isidentifier():
        return f"{flag} needs a variable name (a Python identifier), got {name!r}"
    if keyword.iskeyword(name):
        return (
            f"{flag} {name!r} is a Python keyword, which no code can use as a variable; "
            "pick another name"
        )
    return None


def baseline_report(name: str, namespace: dict[str, Any]) -> ProfileReport:
    """Return the report stored under --baseline NAME in `namespace`, checked before the
    cell runs: a UsageError says what is wrong."""
    from gpuprof_nb.results.report import ProfileReport

    problem = name_problem(name, "--baseline")
    if problem:
        raise UsageError(f"%%gpuprofile {problem}")
    if name not in namespace:
        raise UsageError(
            f"%%gpuprofile --baseline {name}: no variable {name!r}; store a report first "
            f"with `%%gpuprofile -o {name}`"
        )
    value = namespace[name]
    if not isinstance(value, ProfileReport):
        raise UsageError(
            f"%%gpuprofile --baseline {name}: {name!r} is a {type(value).__name__}, not a "
            f"ProfileReport; store one with `%%gpuprofile -o {name}`"
        )
    return value

"""The `%%gpuprofile` option line: the options it takes, and parsing a line into checked
options before anything runs.

- `OPTIONS` declares every option (flags, argparse settings, help) in the order
  `%%gpuprofile?` lists them; the magic hands them to IPython's `@argument`, which builds
  the parser and the help from them;
- `OptionLines` parses a line with that parser and checks the values (ranges, options that
  exclude each other, the --sort key); every mistake is one UsageError with the usage. A
  line parsed before comes from a cache;
- `baseline_report` looks up the report that --baseline names in the user namespace.
"""

from __future__ import annotations

import keyword
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from gpuprof_nb.capture.cell import remember

if TYPE_CHECKING:
    from gpuprof_nb.results.report import ProfileReport

Option = tuple[tuple[str, ...], dict[str, Any]]


def _option(*flags: str, **settings: Any) -> Option:
    return flags, settings


OPTIONS: tuple[Option, ...] = (
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
    _option(
        "--no-modules",
        dest="modules",
        action="store_false",
        help="do not record nn.Module ranges in the profiled run (they cost about 1 us "
        "per module call; the Modules tab then has nothing to show)",
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


class OptionLines:
    """Parses option lines with the magic's parser (IPython's, built from OPTIONS)."""

    def __init__(self, parser: Any) -> None:
        self.parser = parser
        # Lines already parsed and checked (argparse costs ~30 us; the namespace is never
        # modified). A bad line is never cached: it is refused every time.
        self._cache: dict[str, Any] = {}

    def parse(self, line: str) -> Any:
        """Return the parsed options; every mistake becomes a UsageError with the usage."""
        args = self._cache.get(line)
        if args is None:
            args = self._parse_uncached(line)
            remember(self._cache, line, args)
        return args

    def _parse_uncached(self, line: str) -> Any:
        try:
            args = self.parser.parse_argstring(line)
        except UsageError as exc:
            raise UsageError(f"%%gpuprofile: {exc}\n{self.usage()}") from None
        except ValueError as exc:  # unbalanced quotes in the option line
            raise UsageError(f"%%gpuprofile: {exc}\n{self.usage()}") from None
        problems = _problems(args)
        if problems:
            raise UsageError("%%gpuprofile: " + "; ".join(problems) + "\n" + self.usage())
        return args

    def usage(self) -> str:
        """Return 'usage: %%gpuprofile [...]' (IPython's formatter writes reST: '::' and a
        single %)."""
        lines = [ln.strip() for ln in self.parser.format_usage().splitlines()]
        body = " ".join(ln for ln in lines if ln and ln != "::")
        if body.startswith("%") and not body.startswith("%%"):
            body = "%" + body
        return f"usage: {body}\n(`%%gpuprofile?` explains every option)"


def _problems(args: Any) -> list[str]:
    """Return what is wrong with parsed options (values out of range, options that exclude
    each other, an unknown --sort key); empty when nothing is."""
    problems = []
    for flag, value, low, high in (
        ("--warmup", args.warmup, 0, MAX_WARMUP),
        ("--repeat", args.repeat, 1, MAX_REPEAT),
        ("--number", args.number, 1, MAX_NUMBER),
        ("--top", args.top, 1, MAX_TOP),
    ):
        if value is None:
            continue
        if value < low:
            problems.append(f"{flag} must be {low} or more, got {value}")
        elif value > high:
            problems.append(
                f"{flag} must be at most {high:,}, got {_count(value)}: more would run for hours "
                "(or for ever)"
            )
    if args.number is not None and args.once:
        problems.append("--number times repeated runs; --once runs the cell once: drop one of them")
    if args.output is not None:
        problem = name_problem(args.output, "-o")
        if problem:
            problems.append(problem)
    if args.timing_only and args.trace:
        problems.append("--trace needs a profiled run; drop --timing-only")
    if args.timing_only and (args.stack or args.memory):
        problems.append("--stack/--memory need the profiler; drop --timing-only")
    if args.sort is not None:
        problem = _check_sort_key(args.sort)
        if problem:
            problems.append(problem)
    return problems


# Upper bounds of the counts (each far past any real use: --repeat 10000 of a 1 s cell is
# hours), so a typo cannot run for ever.
MAX_WARMUP = 10_000
MAX_REPEAT = 10_000
MAX_NUMBER = 10_000_000
MAX_TOP = 100_000


def _count(value: int) -> str:
    return f"{value:,}" if value.bit_length() < 64 else f"a number of {len(str(value)):,} digits"


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


def output_path_problem(path: str, flag: str) -> str | None:
    """Return why a file cannot be written at `path` (a FIFO, a directory, a device, a
    parent that is no folder), or None; checked before the cell runs."""
    from gpuprof_nb.errors import GpuprofError
    from gpuprof_nb.io.guards import check_writable

    try:
        check_writable(path, what=f"{flag}", error=GpuprofError)
    except GpuprofError as exc:
        return f"{flag}: {exc}"
    return None


def _check_sort_key(key: str) -> str | None:
    """Return why `key` is not a valid --sort key, or None when it is."""
    from gpuprof_nb.analysis.ops import SORT_KEYS

    if key in SORT_KEYS:
        return None
    return f"--sort {key!r} is not one of: {', '.join(sorted(SORT_KEYS))}"


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

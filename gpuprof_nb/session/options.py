"""The options of a cell run, frozen and typed: `ProfileOptions` (a `%%gpuprofile` cell,
session/profile.py) and `MemsnapOptions` (a `%%memsnap` cell, session/memsnap.py), each
with the problems a set of them can have in the flags' words. Torch is not imported here:
a magic checks its line before anything runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpuprof_nb.analysis.memory import parse_window
from gpuprof_nb.analysis.ops import SORT_KEYS
from gpuprof_nb.results.fit import parse_bytes

__all__ = [
    "MemsnapOptions",
    "ProfileOptions",
    "Window",
    "count_words",
    "parse_bytes",
    "parse_window",
]

# Upper bounds of the counts (each far past any real use: --repeat 10000 of a 1 s cell is
# hours), so a typo cannot run for ever or fill memory.
MAX_WARMUP = 10_000
MAX_REPEAT = 10_000
MAX_NUMBER = 10_000_000
MAX_TOP = 100_000
MAX_ENTRIES = 100_000_000


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """How to run one `%%gpuprofile` cell (the magic's options of the same names; see
    `%%gpuprofile?`). `warmup` None: adaptive; `number` None: chosen as timeit does; `sort`
    None: self device time on GPU, self CPU time on CPU; `trace_path`: where to write the
    Chrome trace too (--trace)."""

    warmup: int | None = None
    repeat: int = 3
    number: int | None = None
    once: bool = False
    timing_only: bool = False
    stack: bool = False
    memory: bool = False
    modules: bool = True
    top: int = 20
    sort: str | None = None
    trace_path: str | None = None

    def problems(self) -> list[str]:
        """Return what is wrong with these options (values out of range, options that
        exclude each other, an unknown sort key), in the flags' words; empty when nothing
        is."""
        problems = []
        for flag, value, low, high in (
            ("--warmup", self.warmup, 0, MAX_WARMUP),
            ("--repeat", self.repeat, 1, MAX_REPEAT),
            ("--number", self.number, 1, MAX_NUMBER),
            ("--top", self.top, 1, MAX_TOP),
        ):
            if value is None:
                continue
            if value < low:
                problems.append(f"{flag} must be {low} or more, got {value}")
            elif value > high:
                problems.append(
                    f"{flag} must be at most {high:,}, got {count_words(value)}: more would "
                    "run for hours (or for ever)"
                )
        if self.number is not None and self.once:
            problems.append(
                "--number times repeated runs; --once runs the cell once: drop one of them"
            )
        if self.timing_only and self.trace_path:
            problems.append("--trace needs a profiled run; drop --timing-only")
        if self.timing_only and (self.stack or self.memory):
            problems.append("--stack/--memory need the profiler; drop --timing-only")
        if self.sort is not None and self.sort not in SORT_KEYS:
            problems.append(f"--sort {self.sort!r} is not one of: {', '.join(sorted(SORT_KEYS))}")
        return problems


def count_words(value: int) -> str:
    """Return a count as an option's error message shows it (a huge one by its length)."""
    return f"{value:,}" if value.bit_length() < 64 else f"a number of {len(str(value)):,} digits"


Window = tuple[float | None, float | None]


@dataclass(frozen=True, slots=True)
class MemsnapOptions:
    """How to record one `%%memsnap` cell (the magic's options of the same names; see
    `%%memsnap?`). `window` is (start, end) in ms (history entries when the snapshot has no
    times); `fit` names the batch-size variable; `budget_bytes` is --budget read as bytes."""

    max_entries: int | None = None
    stacks: Literal["python", "all"] = "python"
    repeat: int = 1
    window: Window | None = None
    fit: str | None = None
    budget_bytes: int | None = None
    apply: bool = False

    def problems(self) -> list[str]:
        """Return what is wrong with these options, in the flags' words; empty when
        nothing is."""
        problems = []
        if not 1 <= self.repeat <= MAX_REPEAT:
            problems.append(
                f"--repeat must be at least 1 and at most {MAX_REPEAT:,}, got "
                f"{count_words(self.repeat)}"
            )
        if self.max_entries is not None and not 1 <= self.max_entries <= MAX_ENTRIES:
            problems.append(
                f"--max-entries must be at least 1 and at most {MAX_ENTRIES:,}, got "
                f"{count_words(self.max_entries)}"
            )
        if self.fit is not None and self.repeat > 1:
            problems.append("--fit records the cell once per batch size; drop --repeat")
        if self.apply and self.budget_bytes is None:
            problems.append("--apply applies the plan made under --budget; give one")
        return problems

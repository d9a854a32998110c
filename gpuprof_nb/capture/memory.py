"""Memory history around a cell -> a snapshot dict (the format _dump_snapshot pickles).

CUDA: the caching allocator's own history (`torch.cuda.memory._record_memory_history`),
switched off again afterwards, with a snapshot taken at an out-of-memory error before it
propagates; a history the user was already recording is read, not restarted, and left
running. Without CUDA: torch.profiler's memory events (profile_memory, shapes, Python
stacks) rebuilt into the same dict, with the categories PyTorch's memory profiler assigns.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

import torch

from gpuprof_nb.capture import device as capture_device
from gpuprof_nb.capture.linetrace import LineTracer, default_engine
from gpuprof_nb.capture.step import MARK, StepRecorder
from gpuprof_nb.errors import CaptureError
from gpuprof_nb.model.frames import frame_kind, profiler_frame_parts
from gpuprof_nb.model.memory import OP_FILENAME

DEFAULT_MAX_ENTRIES = 200_000
_STEP_MARK = "gpuprof_nb.memsnap.step#"
# The annotation that ties the line events' clock to the profiler's.
_CLOCK_MARK = "gpuprof_nb.memsnap.clock"
_NO_LINES_NOTE = (
    "Allocation sites name functions, not lines: another tool holds the interpreter's "
    "line events (a debugger or coverage), and torch.profiler records only where each "
    "function starts."
)


@dataclass(frozen=True, slots=True)
class MemoryCapture:
    """What recording a cell produced: the snapshot dict, the device it is about, the
    entry index where each repeat began, and the out-of-memory error the cell raised
    (the caller shows the report, then re-raises it unchanged)."""

    snapshot: dict[str, Any]
    device: int
    source: str  # "cuda" | "cpu-profiler"
    step_starts: tuple[int, ...] = ()
    oom: BaseException | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


def record_memory(
    run: Callable[[], object],
    *,
    repeat: int = 1,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    stacks: str = "python",
    namespace: dict[str, Any] | None = None,
    step: bool = True,
    cell_code: CodeType | None = None,
) -> MemoryCapture:
    """Return the memory history of `repeat` calls of `run`: CUDA allocator history when
    CUDA is available, else the CPU profiler fallback (which reads the line of `cell_code`'s
    code that allocated, where given). Exceptions from `run` propagate unchanged, except a
    CUDA out-of-memory error, which is returned in `.oom`. With `step`, the step's modules,
    optimizer steps and tagged storages are recorded beside it (capture/step.py;
    `namespace` is where the model's variable name is looked up)."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    if capture_device.cuda_available():
        recorder = StepRecorder("cuda", namespace) if step else None
        return record_cuda_memory(
            run, repeat=repeat, max_entries=max_entries, stacks=stacks, recorder=recorder
        )
    return record_cpu_memory(
        run,
        repeat=repeat,
        recorder=StepRecorder("cpu", namespace) if step else None,
        cell_code=cell_code,
    )


def _start_history(max_entries: int, stacks: str) -> None:
    # Stacks of allocations only (context="alloc"): nothing here reads a free's stack, and
    # taking Python stacks at frees broke backward through activation checkpointing on an
    # H100 (torch 2.11: run_backward "returned NULL without setting an exception" when a
    # checkpointed TransformerEncoderLayer recomputed; context="alloc" ran it cleanly).
    record = torch.cuda.memory._record_memory_history
    try:
        record(
            enabled="all",
            context="alloc",
            stacks=stacks,
            max_entries=max_entries,
            clear_history=True,
        )
    except TypeError:  # torch before 2.2 has no clear_history
        record(enabled="all", context="alloc", stacks=stacks, max_entries=max_entries)


def history_recording() -> bool:
    """Return True when the CUDA allocator is already recording a memory history (someone
    called torch.cuda.memory._record_memory_history before); False when it is not, or when
    this torch build cannot tell (then it is treated as not recording, as before)."""
    probe = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if probe is None:
        return False
    try:
        return bool(probe())
    except RuntimeError:
        return False


def record_cuda_memory(
    run: Callable[[], object],
    *,
    repeat: int = 1,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    stacks: str = "python",
    recorder: StepRecorder | None = None,
) -> MemoryCapture:
    """Return the CUDA caching allocator's history over `repeat` calls of `run`.

    Recording is switched off (`_record_memory_history(enabled=None)`) before this returns
    or raises. If a history was already being recorded when this began, it is neither
    restarted (that would clear its buffer and change its settings) nor switched off: the
    snapshot keeps only the entries from the cell on, and a note says so. On
    torch.cuda.OutOfMemoryError the snapshot is taken right away (the traceback still holds
    the frames, so their tensors are still live) and the error is returned in `.oom` for
    the caller to re-raise after showing the report.
    """
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
    device = torch.cuda.current_device()
    users = history_recording()
    marker, marker_addr = _open_history(users, device, max_entries, stacks)
    try:
        starts_us, oom = _run_on_cuda(run, repeat, recorder)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        # Freed only now, so nothing in the cell can have been given its address; freed
        # here too when the cell raises (a kept traceback would hold it otherwise).
        marker = None  # noqa: F841
        if not users:
            torch.cuda.memory._record_memory_history(enabled=None)
    snapshot, notes = _cuda_history_notes(
        snapshot, device, users, oom, max_entries, marker_addr, starts_us
    )
    step_starts = _indices_at(snapshot, device, starts_us) if repeat > 1 else ()
    if recorder is not None:
        record = recorder.record()
        if record is not None:
            snapshot.setdefault("gpuprof_nb", {})["step"] = record
        notes += recorder.notes()
    return MemoryCapture(
        snapshot=snapshot,
        device=device,
        source="cuda",
        step_starts=step_starts,
        oom=oom,
        notes=notes,
    )


def _open_history(users: bool, device: int, max_entries: int, stacks: str) -> tuple[object, int]:
    """Start recording the history, or with one the user already records (`users`), mark
    where the cell begins in it: return the marker tensor (held until the snapshot is
    taken) and its address; (None, 0) when there is no marker."""
    if users:
        try:
            return _history_marker(device)
        except torch.cuda.OutOfMemoryError:
            # Not even 512 bytes free: the cell's entries are then told by their times.
            return None, 0
    try:
        _start_history(max_entries, stacks)
    except (RuntimeError, AttributeError) as e:
        raise CaptureError(
            f"could not start CUDA memory history ({e}); this torch build may lack it. "
            "Update torch, or run without %%memsnap."
        ) from e
    return None, 0


def _run_on_cuda(
    run: Callable[[], object], repeat: int, recorder: StepRecorder | None
) -> tuple[list[int], BaseException | None]:
    """Run `run` `repeat` times between device synchronisations; return when each repeat
    began (unix us, the clock time_us uses) and the out-of-memory error that stopped them
    (its traceback keeps the cell's tensors live until the snapshot). Other exceptions
    propagate; the recorder is removed either way."""
    starts_us: list[int] = []
    try:
        if recorder is not None:
            recorder.install()
        for _ in range(repeat):
            torch.cuda.synchronize()
            starts_us.append(time.time_ns() // 1000)
            run()
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError as e:
        return starts_us, e
    finally:
        if recorder is not None:
            recorder.remove()
    return starts_us, None


def _cuda_history_notes(
    snapshot: dict[str, Any],
    device: int,
    users: bool,
    oom: BaseException | None,
    max_entries: int,
    marker_addr: int,
    starts_us: list[int],
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Return the snapshot (from the cell on, when the history was the user's) and the
    notes on what its history holds: the user's recording, a buffer that may have
    wrapped, or a cell that allocated nothing on the device."""
    notes: tuple[str, ...] = ()
    if users:
        snapshot, notes = _from_cell_on(snapshot, device, marker_addr, starts_us[0])
    elif _full(snapshot, device, max_entries):
        notes = (
            "The history buffer may have dropped the oldest entries (--max-entries); "
            "those frees count as 'allocated before recording'.",
        )
    traces = snapshot.get("device_traces") or []
    if not users and oom is None and (device >= len(traces) or not traces[device]):
        # On a GPU machine a cell that works on CPU tensors leaves the history empty: say
        # why, instead of leaving "no history" to read as a recording that failed.
        notes += (
            f"The cell made no allocation on cuda:{device} while its history was "
            "recorded (CPU tensors are not in the CUDA allocator's history): what "
            "follows is the device's state after the cell.",
        )
    return snapshot, notes


def _history_marker(device: int) -> tuple[object, int]:
    """Return a small CUDA tensor and its address: its alloc entry in a running history
    marks where the cell begins, on the allocator's own record rather than a clock."""
    marker = torch.empty(512, dtype=torch.uint8, device=torch.device("cuda", device))
    return marker, int(marker.data_ptr())


def _from_cell_on(
    snapshot: dict[str, Any], device: int, marker_addr: int, start_us: int
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Return a copy of a snapshot from the user's own running history with only the
    entries after the marker's alloc on `device` (allocated just before the cell, live
    until the snapshot, so the last alloc at its address is the marker), and the notes
    that say so. When the buffer no longer holds the marker (it wrapped, or skips allocs),
    entries from `start_us` (unix us, the clock time_us uses) on are kept; without times,
    every entry is kept, and the note says that too."""
    notes = [
        "A CUDA memory history was already being recorded when the cell started "
        "(torch.cuda.memory._record_memory_history): %%memsnap read it and left it "
        "running with its own settings (--max-entries and --stacks do not apply; "
        "one 512-byte allocation in it marks where the cell began)."
    ]
    traces = snapshot.get("device_traces") or []
    mine = traces[device] if device < len(traces) else []
    if len(mine) <= 1:
        notes.append(
            "Its buffer holds at most one entry: a recording started with "
            "enabled='state' or max_entries=1 keeps no history, so allocations "
            "may be missing. To record the cell in full, stop it with "
            "torch.cuda.memory._record_memory_history(enabled=None) and run the "
            "cell again."
        )
    cut = next(
        (
            i
            for i in range(len(mine) - 1, -1, -1)
            if mine[i].get("action") == "alloc" and mine[i].get("addr") == marker_addr
        ),
        None,
    )
    if cut is not None:
        kept = [list(t) for t in traces]
        kept[device] = list(mine[cut + 1 :])
        # Other devices have no marker: their entries are cut by time where they have it.
        for d, t in enumerate(traces):
            if d != device and all(e.get("time_us") is not None for e in t):
                kept[d] = [e for e in t if e["time_us"] >= start_us]
    elif all(e.get("time_us") is not None for t in traces for e in t):
        kept = [[e for e in t if e["time_us"] >= start_us] for t in traces]
    else:
        notes.append("Its entries carry no times, so entries from before the cell are included.")
        return snapshot, tuple(notes)
    notes.append("Entries recorded before the cell are left out.")
    return {**snapshot, "device_traces": kept}, tuple(notes)


def _full(snapshot: dict[str, Any], device: int, max_entries: int) -> bool:
    traces = snapshot.get("device_traces") or []
    return device < len(traces) and len(traces[device]) >= max_entries


def _indices_at(snapshot: dict[str, Any], device: int, starts_us: list[int]) -> tuple[int, ...]:
    """Map wall-clock repeat starts (unix us, the clock time_us uses) to entry indices."""
    traces = snapshot.get("device_traces") or []
    entries = traces[device] if device < len(traces) else []
    times = [e.get("time_us") for e in entries]
    if not entries or any(t is None for t in times):
        return ()
    import bisect

    found = tuple(bisect.bisect_left(times, t) for t in starts_us)
    # time_us is unix time on the allocator's clock; if that ever stops matching ours,
    # every start lands at one end of the history: report no steps rather than wrong ones.
    if len(found) > 1 and len(set(found[1:])) == 1 and found[1] in (0, len(entries)):
        return ()
    return found


# ---------------------------------------------------------------------------------------
# CPU fallback


def _name(node: Any) -> str:
    """Return a profiler event's name; '' when torch cannot decode it (seen with some
    builtin-call events whose name bytes are not UTF-8)."""
    try:
        return str(node.name)
    except UnicodeDecodeError:
        return ""


def _frames_of(
    event: Any, cache: dict[tuple[Any, ...], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Return the allocation's stack, innermost first: the torch op that allocated, then
    the Python frames (`file(line): function`) around it. Equal stacks share one list."""
    key: list[Any] = []
    parent = event.parent
    op_name = None
    in_python = False
    while parent is not None:
        tag = str(parent.tag)
        if tag.endswith("TorchOp") and not in_python:
            # The outermost op below the Python code is the one the user called
            # (aten::randn, not the aten::empty it allocates through).
            op_name = _name(parent)
        elif tag.endswith(("PyCall", "PyCCall")):
            in_python = True
            if tag.endswith("PyCall"):
                key.append(_name(parent))
        parent = parent.parent
    if op_name:
        key.insert(0, "op:" + op_name)
    k = tuple(key)
    hit = cache.get(k)
    if hit is not None:
        return hit
    frames = []
    for name in k:
        if name.startswith("op:"):
            frames.append({"filename": OP_FILENAME, "line": 0, "name": name[3:]})
            continue
        parts = profiler_frame_parts(name)
        if parts is not None:
            frames.append({"filename": parts[0], "line": parts[1], "name": parts[2]})
        else:
            frames.append({"filename": "??", "line": 0, "name": name})
    cache[k] = frames
    return frames


def _all_nodes(roots: list[Any]) -> list[Any]:
    out: list[Any] = []
    stack = list(reversed(roots))
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(node.children))
    return out


def _categories(prof: Any) -> tuple[dict[Any, str], list[Any] | None, str | None]:
    """Return (TensorKey -> category name at creation), the memory profiler's sorted event
    nodes, and a note when the memory profiler could not run."""
    try:
        from torch.profiler._memory_profiler import Action

        mp = prof._memory_profile()
        cats: dict[Any, str] = {}
        for _t, action, (key, version), _size in mp.timeline:
            if action in (Action.CREATE, Action.PREEXISTING) and key not in cats:
                cat = mp._categories.get(key, version)
                if cat is not None:
                    cats[key] = cat.name.lower()
        return cats, list(mp._op_tree.sorted_nodes), None
    except Exception as e:  # private API: any failure only costs the categories
        return {}, None, f"PyTorch's memory profiler could not categorise tensors ({e})."


class _ExactLines:
    """The line of the user's code that ran at each moment of the recording (exact line
    events, capture/linetrace.py), read back at the profiler's allocation times.

    torch.profiler's Python events name the line where each function starts, so an
    allocation made by a cell's own top-level code had no line at all. The tracer runs
    beside the profiler; a marker recorded between two perf_counter_ns stamps puts its
    times on the profiler's clock."""

    def __init__(self, cell_code: CodeType) -> None:
        self.tracer = LineTracer(cell_code)
        self._mid_ns = 0.0
        self._times: list[float] = []
        self._stacks: list[list[dict[str, Any]]] = []
        self._of: list[int] = []

    def start(self) -> None:
        from torch.profiler import record_function

        # The first annotation of a profiling session is slow to enter (about a
        # millisecond): a first one unstamped, so the stamped one is tight.
        for _ in range(2):
            before = time.perf_counter_ns()
            with record_function(_CLOCK_MARK):
                pass
            after = time.perf_counter_ns()
        self._mid_ns = (before + after) / 2
        self.tracer.start()

    def stop(self) -> None:
        self.tracer.stop()

    def read(self, nodes: list[Any]) -> bool:
        """Put the line events on the profiler's clock through the marker among `nodes`;
        False when the marker is missing (the lines are then left unknown)."""
        marks = [n for n in nodes if _name(n) == _CLOCK_MARK]
        mark = max(marks, key=lambda n: n.start_time_ns) if marks else None
        if mark is None:
            return False
        end = getattr(mark, "end_time_ns", mark.start_time_ns)
        shift = (mark.start_time_ns + end) / 2 - self._mid_ns
        entry = self.tracer.record(lambda ns: (ns + shift) / 1000)
        frames = entry["frames"]
        self._stacks = [
            [
                {"filename": frames[f][0], "line": frames[f][1], "name": frames[f][2]}
                for f in reversed(stack)
            ]
            for stack in entry["stacks"]
        ]
        self._times = entry["ts_us"]
        self._of = entry["stack_of"]
        return True

    def at(self, time_ns: int) -> list[dict[str, Any]] | None:
        """The user's stack (innermost first, exact lines) running at `time_ns` on the
        profiler's clock; None outside the cell."""
        i = bisect.bisect_right(self._times, time_ns / 1000) - 1
        if i < 0:
            return None
        return self._stacks[self._of[i]] or None


def _with_lines(
    frames: list[dict[str, Any]],
    exact: list[dict[str, Any]] | None,
    cache: dict[tuple[int, int], list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """The allocation's stack with the user's frames at the lines that ran: the op and the
    library frames inside the innermost user frame kept, the rest replaced by the exact
    stack; without one (time outside the cell), every Python line set to unknown (0)."""
    key = (id(frames), id(exact))
    hit = cache.get(key)
    if hit is not None:
        return hit
    if exact is None:
        out = [f if f["filename"] == OP_FILENAME else {**f, "line": 0} for f in frames]
    else:
        inner = []
        for f in frames:
            if f["filename"] != OP_FILENAME and frame_kind(f["filename"]) == "user":
                break
            inner.append(f)
        out = inner + exact
    cache[key] = out
    return out


def record_cpu_memory(
    run: Callable[[], object],
    *,
    repeat: int = 1,
    recorder: StepRecorder | None = None,
    cell_code: CodeType | None = None,
) -> MemoryCapture:
    """Return a snapshot dict rebuilt from torch.profiler's CPU memory events over
    `repeat` calls of `run` (the fallback without CUDA). With `cell_code` (the code `run`
    runs) each allocation names the line of the user's code that made it (exact line
    events beside the profiler), where this interpreter offers them. The profiler is
    stopped before this returns or raises; exceptions from `run` propagate unchanged. With
    a `recorder`, the step record goes with it, and the storages it tagged that were live
    before the cell and still are at its end (parameters, optimizer state) are counted as
    live throughout: the profiler itself sees no memory allocated before it started."""
    from gpuprof_nb.capture.profiler import profiler_running

    if profiler_running():
        raise CaptureError(
            "a torch profiler is already recording in this process; %%memsnap needs it on "
            "the CPU. Leave its `with profile(...)` block first."
        )
    lines = _ExactLines(cell_code) if cell_code is not None and default_engine() else None
    prof = _profile_cell(run, repeat, recorder, lines)
    cats, nodes, cat_note = _categories(prof)
    if nodes is None:
        results = prof.profiler.kineto_results if prof.profiler is not None else None
        if results is None:
            raise CaptureError("torch.profiler returned no results for the cell; run it again")
        nodes = _all_nodes(results.experimental_event_tree())
        nodes.sort(key=lambda n: n.start_time_ns)
    exact = lines is not None and lines.read(nodes)
    history = _cpu_history(nodes, cats, lines if exact else None)
    record, before, notes = _kept_from_cell(recorder, history)
    times = [e["time_us"] for e in history.entries]
    step_starts = (
        tuple(bisect.bisect_left(times, t) for t in sorted(history.step_times))
        if repeat > 1
        else ()
    )
    if cat_note:
        notes.append(cat_note)
    if cell_code is not None and not exact:
        notes.append(_NO_LINES_NOTE)
    own: dict[str, Any] = {
        "source": "cpu-profiler",
        "step_starts": [list(step_starts)],
        "notes": notes,
    }
    if exact:
        own["exact_lines"] = True
    if record is not None:
        own["step"] = record
    snapshot = {
        "segments": _block_segments([*history.live.values(), *before]),
        "device_traces": [history.entries],
        "gpuprof_nb": own,
    }
    return MemoryCapture(
        snapshot=snapshot,
        device=0,
        source="cpu-profiler",
        step_starts=step_starts,
        notes=tuple(notes),
    )


def _profile_cell(
    run: Callable[[], object],
    repeat: int,
    recorder: StepRecorder | None,
    lines: _ExactLines | None,
) -> Any:
    """Return the torch.profiler (CPU, memory, shapes, stacks) that ran `run` `repeat`
    times, each repeat under a step mark, with the recorder and the line events around
    them; all are stopped before this returns or raises."""
    from torch.profiler import ProfilerActivity, profile, record_function

    prof = profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    )
    with prof:
        if lines is not None:
            lines.start()
        try:
            if recorder is not None:
                recorder.install()
            for i in range(repeat):
                with record_function(f"{_STEP_MARK}{i}"):
                    run()
        finally:
            if recorder is not None:
                recorder.remove()
            if lines is not None:
                lines.stop()
    return prof


@dataclass(slots=True)
class _CpuHistory:
    """The history rebuilt from the profiler's events: entries in the snapshot's format,
    the allocations still live at the end by address, when each repeat began (unix us
    of the profiler's clock) and the allocation count at each step-recorder mark."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    live: dict[int, dict[str, Any]] = field(default_factory=dict)
    step_times: list[int] = field(default_factory=list)
    marks: dict[int, int] = field(default_factory=dict)


def _cpu_history(nodes: list[Any], cats: dict[Any, str], lines: _ExactLines | None) -> _CpuHistory:
    """Return the history of the CPU allocations among the profiler's `nodes` (sorted by
    start): an alloc entry each, a free_requested and a free_completed per free; stacks at
    the exact lines where `lines` (already read) gives them; step and recorder marks."""
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import TensorKey

    history = _CpuHistory()
    exact_cache: dict[tuple[int, int], list[dict[str, Any]]] = {}
    cache: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    n_allocs = 0
    for node in nodes:
        if node.tag == _EventType.Allocation:
            ef = node.extra_fields
            if ef.device.type != "cpu" or not ef.alloc_size:
                continue
            t_us = node.start_time_ns // 1000
            if ef.alloc_size > 0:
                frames = _frames_of(node, cache)
                if lines is not None:
                    frames = _with_lines(frames, lines.at(node.start_time_ns), exact_cache)
                e = _alloc_entry(ef, frames, t_us, cats, TensorKey)
                history.entries.append(e)
                n_allocs += 1
                history.live[ef.ptr] = e
            else:
                opened = history.live.pop(ef.ptr, None)
                frames = opened["frames"] if opened else _frames_of(node, cache)
                if lines is not None and not opened:
                    frames = _with_lines(frames, lines.at(node.start_time_ns), exact_cache)
                for action in ("free_requested", "free_completed"):
                    history.entries.append(
                        {
                            "action": action,
                            "addr": ef.ptr,
                            "size": -ef.alloc_size,
                            "stream": 0,
                            "frames": frames,
                            "time_us": t_us,
                        }
                    )
        else:
            name = _name(node)
            if name.startswith(_STEP_MARK):
                history.step_times.append(node.start_time_ns // 1000)
            elif name.startswith(MARK):
                history.marks[int(name[len(MARK) :])] = n_allocs
    return history


def _alloc_entry(
    ef: Any, frames: list[dict[str, Any]], t_us: int, cats: dict[Any, str], tensor_key: Any
) -> dict[str, Any]:
    """Return the alloc entry of an allocation event's fields, with the category PyTorch's
    memory profiler gave its tensor (`cats`, by `tensor_key`: its TensorKey class), where
    it gave one."""
    e = {
        "action": "alloc",
        "addr": ef.ptr,
        "size": ef.alloc_size,
        "stream": 0,
        "frames": frames,
        "time_us": t_us,
    }
    try:
        key = tensor_key.from_allocation(ef)
    except Exception:  # private API; the category is optional
        key = None
    if key is not None and key in cats:
        e["category"] = cats[key]
    return e


def _kept_from_cell(
    recorder: StepRecorder | None, history: _CpuHistory
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[str]]:
    """Return the step record, the blocks of the cell's modules and optimizers live since
    before it (`_kept_from_before`), and the notes on what memory from before the cell is
    counted."""
    notes = [
        "Memory allocated before the cell and not freed during it is not seen by the "
        "profiler, so it is not counted."
    ]
    record: dict[str, Any] | None = None
    before: list[dict[str, Any]] = []
    if recorder is not None:
        record = recorder.record(history.marks)
    if record is not None and recorder is not None:
        before = _kept_from_before(recorder.alive_at_end(), history.live, history.entries)
        notes[0] = (
            "Memory allocated before the cell and not freed during it is not seen by the "
            "profiler; of it, only the parameters, buffers, gradients and optimizer state "
            "of the modules and optimizers the cell used are counted "
            f"({len(before)} storages, {sum(b['size'] for b in before):,} B, as live "
            "before the cell)."
        )
    if recorder is not None:
        notes.extend(recorder.notes())
    return record, before, notes


def _block_segments(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return one segment per block live at the end, by address: the profiler sees no
    allocator segments, so 'reserved' is the live memory itself."""
    return [
        {
            "device": 0,
            "address": e["addr"],
            "total_size": e["size"],
            "allocated_size": e["size"],
            "active_size": e["size"],
            "stream": 0,
            "segment_type": "cpu",
            "blocks": [
                {
                    "address": e["addr"],
                    "size": e["size"],
                    "requested_size": e["size"],
                    "state": "active_allocated",
                    "frames": e["frames"],
                }
            ],
        }
        for e in sorted(blocks, key=lambda e: e["addr"])
    ]


def _kept_from_before(
    alive: dict[int, int], live: dict[int, dict[str, Any]], entries: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Return blocks (addr, size, frames) for the storages of the cell's modules and
    optimizers alive at its end (`alive`: address -> bytes) that no allocation during it
    made: they were live before it and still are. A storage the cell freed and another
    allocation then reused is in `live` under the new one."""
    freed = {e["addr"] for e in entries if e["action"] == "free_completed"}
    # Freed during the cell and alive at its end: only an allocation during the cell can
    # have put a tensor there again, and that one is in `live`.
    return [
        {"addr": addr, "size": size, "frames": []}
        for addr, size in sorted(alive.items())
        if addr not in live and addr not in freed
    ]

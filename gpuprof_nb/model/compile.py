"""What torch.compile's Dynamo reported while a cell ran (capture/dynamo.py), as io/
compile_log.py reads it from a trace's own key: the frames it compiled and the graph breaks
and recompiles it met. Explained by analysis/compile.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CompileEventKind = Literal["graph_break", "recompile"]


@dataclass(frozen=True, slots=True)
class CompileEvent:
    """One graph break or recompile, as Dynamo logged it: `text` is its message (a graph
    break's starts "Graph break in user code at FILE:LINE"; a recompile's lists the guards
    that failed, one per line, "F/G: reason"); `source` is the text of the user's line and
    `function` the function it is in (graph breaks)."""

    kind: CompileEventKind
    compile_id: str
    text: str
    source: str = ""
    function: str = ""


@dataclass(frozen=True, slots=True)
class CompiledFrame:
    """One compile of one Python frame (`compile_id` "F/G": frame F's G-th compile): the
    function, where it starts, the compile time in seconds, the ops in the graph it made (0:
    no graph), why Dynamo restarted its analysis (graph breaks), and why it failed, if it
    did. `earlier`: compiled before this cell ran (the cell may still run its graph)."""

    compile_id: str
    function: str
    file: str
    first_line: int
    compile_time_s: float | None = None
    graph_ops: int | None = None
    restart_reasons: tuple[str, ...] = ()
    fail_type: str = ""
    fail_reason: str = ""
    earlier: bool = False


@dataclass(frozen=True, slots=True)
class CompileLog:
    """Dynamo's record of one cell. `logged`: the structured log was read (else the frames
    come from its compilation metrics alone, and breaks and recompiles are not listed)."""

    logged: bool
    events: tuple[CompileEvent, ...] = ()
    frames: tuple[CompiledFrame, ...] = ()

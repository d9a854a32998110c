"""The loaders' garbage-collector pause: state restored, objects moved to the oldest
generation on the way out (so no collection walks them right after), frozen objects left
frozen."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from gpuprof_nb.gcpause import gc_paused
from gpuprof_nb.io.snapshot import load_snapshot
from gpuprof_nb.io.trace import load_trace

DATA = Path(__file__).parent / "data"
TRACE = DATA / "a100_event_sync" / "event_sync_trace.json.gz"
SNAPSHOT = DATA / "snapshots" / "fragmented.pickle"


def _in_generation(obj: object, generation: int) -> bool:
    return any(o is obj for o in gc.get_objects(generation=generation))


# Run in a fresh interpreter that first unfreezes what its start-up froze: the check needs
# a process with nothing frozen (else the pause leaves the generations alone, as it should),
# and a test process cannot promise that: an earlier test may have called gc.freeze(), and
# on the GPU image objects are frozen already when the interpreter starts.
_FRESH_PROCESS_CHECK = """
import gc
import sys

from gpuprof_nb.gcpause import gc_paused


def check(ok, what):
    if not ok:  # not assert: python -O would drop it and the check would pass unseen
        sys.exit(f"failed: {what}")


def in_generation(obj, generation):
    return any(o is obj for o in gc.get_objects(generation=generation))


enabled = sys.argv[1] == "True"
gc.unfreeze()  # this process is ours alone: nobody else's frozen objects are released
check(gc.get_freeze_count() == 0, "precondition: nothing frozen at the start")
gc.enable() if enabled else gc.disable()
with gc_paused():
    check(not gc.isenabled(), "paused inside")
    made = [[i] for i in range(1000)]  # tracked containers, no cycles
    check(in_generation(made[0], 0), "made young")
check(gc.isenabled() is enabled, "state restored")
# Moved to the oldest generation only when the collector runs at all.
check(in_generation(made[0], 2 if enabled else 0), "made objects old only when enabled")
check(gc.get_freeze_count() == 0, "nothing left frozen")
print("ok")
"""


@pytest.mark.parametrize("enabled", [True, False])
def test_state_restored_and_made_objects_are_old(enabled: bool) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS_CHECK, str(enabled)],
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_young_garbage_is_collected_not_moved_along() -> None:
    assert gc.isenabled()
    gc.disable()  # no automatic collection between these lines
    try:
        cycle = _Node()
        gone = weakref.ref(cycle)
        del cycle
        assert gone() is not None  # garbage, but in a cycle: still there
    finally:
        gc.enable()
    with gc_paused():
        assert gone() is None  # collected before anything was moved to the old generation


def test_raising_inside_restores_the_state() -> None:
    assert gc.isenabled()
    with pytest.raises(KeyError), gc_paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_objects_frozen_by_someone_else_stay_frozen() -> None:
    keep = [[i] for i in range(100)]
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with gc_paused():
            young = [[1]]
        # Not unfrozen by the pause: the frozen list is still in no generation. (The count
        # itself may drop meanwhile: a frozen object freed by another thread leaves it.)
        assert not any(_in_generation(keep[0], g) for g in range(3))
        assert gc.get_freeze_count() > 0
        assert _in_generation(young[0], 0)  # left where it was: no promotion then
    finally:
        gc.unfreeze()
    assert keep


def test_loaders_leave_their_results_in_the_oldest_generation() -> None:
    trace = load_trace(TRACE)
    assert _in_generation(trace.ops[0], 2) and _in_generation(trace.kernels[0], 2)
    snapshot = load_snapshot(SNAPSHOT)
    assert _in_generation(snapshot, 2)

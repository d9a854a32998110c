"""Shared by the magic tests: a fake clock the magic reads instead of perf_counter_ns."""

from __future__ import annotations

import pytest


class FakeClock:
    """A nanosecond clock that moves only when the cell says how long its run took."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns

    def spend_us(self, us: float) -> None:
        self.ns += round(us * 1000)


@pytest.fixture
def fake_clock(ipython_shell):
    """The magic reads this clock instead of perf_counter_ns; cells call `spend(us)`."""
    magics = ipython_shell.magics_manager.registry["GpuprofileMagics"]
    clock = FakeClock()
    magics.clock = clock
    ipython_shell.user_ns["spend"] = clock.spend_us
    yield clock
    del magics.clock

"""render/timeline._merge (stretches found at once, sums per stretch) against the plain
item-by-item merge it replaces, on random bars: wide and narrow, one colour and several,
overlapping, and with the cases its fast way leaves to the loop (nan, bars ending left of
where they start)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuprof_nb.render import svg
from gpuprof_nb.render.timeline import _bars, _merge, _pixels


def _reference(items, merge_px):
    """The merge item by item over (a_px, b_px, start, end, colour, name) tuples."""
    runs = []
    for a, b, s, e, colour, name in items:
        dur = e - s
        r = runs[-1] if runs else None
        if (
            r is not None
            and a - r["b"] < merge_px
            and (colour in r["colour_us"] or b - a < merge_px or r["b"] - r["a"] < merge_px)
        ):
            if b > r["b"]:
                r["b"] = b
            if e > r["end"]:
                r["end"] = e
            r["count"] += 1
            r["busy"] += dur
            r["colour_us"][colour] = r["colour_us"].get(colour, 0.0) + dur
            if dur > r["longest"][0]:
                r["longest"] = (dur, name)
            continue
        runs.append(
            {
                "a": a,
                "b": b,
                "start": s,
                "end": e,
                "count": 1,
                "busy": dur,
                "colour_us": {colour: dur},
                "longest": (dur, name),
            }
        )
    return runs


def _key(x):
    # nan-safe, sign-of-zero-exact comparison of floats.
    return ("f", x.hex()) if isinstance(x, float) else x


def _same(run, ref) -> None:
    got = (run.a, run.b, run.start_us, run.end_us, run.count, run.busy_us, run.longest)
    want = (ref["a"], ref["b"], ref["start"], ref["end"], ref["count"], ref["busy"], ref["longest"])
    assert [_key(x) if not isinstance(x, tuple) else tuple(map(_key, x)) for x in got] == [
        _key(x) if not isinstance(x, tuple) else tuple(map(_key, x)) for x in want
    ]
    assert {c: v.hex() for c, v in run.colour_us.items()} == {
        c: v.hex() for c, v in ref["colour_us"].items()
    }


def _random_bars(rng, n, colours, odd):
    starts = np.sort(rng.uniform(0.0, 1000.0, n))
    # Mostly short bars, some long ones overlapping their neighbours.
    lengths = np.where(rng.random(n) < 0.9, rng.exponential(0.3, n), rng.exponential(40.0, n))
    ends = starts + lengths
    if odd:
        k = rng.integers(0, n, 3)
        ends[k[0]] = starts[k[0]] - 5.0  # ends before it starts
        ends[k[1]] = math.nan
    cols = [colours[i] for i in rng.integers(0, len(colours), n)]
    names = [f"k{i}" for i in range(n)]
    return list(zip(starts.tolist(), ends.tolist(), cols, names, strict=True))


@pytest.mark.parametrize("seed", range(12))
def test_merge_matches_the_item_by_item_merge(seed: int) -> None:
    rng = np.random.default_rng(seed)
    colours = ["#a", "#b", "#c", "#d"][: 1 + seed % 4]
    n = int(rng.choice([5, 70, 400, 3000]))
    items = _random_bars(rng, n, colours, odd=seed % 5 == 4)
    lo, hi = 10.0, 990.0
    sx = svg.LinearScale(lo, hi, 120.0, 880.0)
    px = _pixels(_bars(items), sx, lo, hi)
    tuples = [
        (a, b, s, e, c, name)
        for a, b, (s, e, c, name) in zip(px.a.tolist(), px.b.tolist(), items, strict=True)
    ]
    for merge_px in (1.0, 2.0, 8.0, 64.0):
        runs = _merge(px, merge_px)
        want = _reference(tuples, merge_px)
        assert len(runs) == len(want)
        for run, ref in zip(runs, want, strict=True):
            _same(run, ref)


def test_colour_breaks_split_a_stretch() -> None:
    # Two wide bars of different colours touching: the second opens its own rectangle,
    # though no gap separates them; narrow bars between join either.
    items = [(0.0, 300.0, "#a", "x")] + [
        (300.0 + i * 0.01, 300.0 + i * 0.01 + 0.005, "#a", f"n{i}") for i in range(100)
    ]
    items += [(301.0, 600.0, "#b", "y"), (600.0, 601.0, "#a", "z")]
    sx = svg.LinearScale(0.0, 1000.0, 100.0, 900.0)
    px = _pixels(_bars(items), sx, 0.0, 1000.0)
    runs = _merge(px, 1.0)
    tuples = [
        (a, b, s, e, c, name)
        for a, b, (s, e, c, name) in zip(px.a.tolist(), px.b.tolist(), items, strict=True)
    ]
    want = _reference(tuples, 1.0)
    assert len(want) == 2
    for run, ref in zip(runs, want, strict=True):
        _same(run, ref)

"""The faster paths of the report's display give what the plainer computation they replace
gives: bracket parsing of kernel names (split at once, or read bracket by bracket where
`operator` is), the cached short names, label placement with the overlap test written out,
the group name and lone-surrogate test of the tabbed HTML in one encoding pass, the Modules
table's cells and hover words made once, and fmt_us's NaN test."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gpuprof_nb import load_trace
from gpuprof_nb.analysis.report import analyze
from gpuprof_nb.render import bundle, html, modules, plot, units
from gpuprof_nb.render.limits import visible_surrogates
from gpuprof_nb.render.sections import Section

DATA = Path(__file__).parent.parent / "data"
BERT = DATA / "h100_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz"

NAMES = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3>)",
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_16x5_nn_align4>"
    "(cutlass_80_tensorop_s1688gemm_128x128_16x5_nn_align4::Params)",
    "void (anonymous namespace)::softmax_warp_forward<float, float, float, 8, false>"
    "(float*, float const*, int, int, int)",
    "void at::native::f(int)::{lambda()#1}::operator()() const::{lambda(float)#2}",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
    "at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>"
    "::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >"
    "(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
    "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)"
    "::{lambda(float, float)#1}>, unsigned int, float, 4>)",
    "void kernel<a<b<c<d<e>>>>>(x<y<z>>, (w))",
    "unbalanced<a<b>(",
    "closes>first<",
    "mismatched<a(b>)",
    "",
    "plain",
    "()",
    "<>",
    "operator< <int>(a<b>)",
    "x::operator<=<T>(T)",
]


def _random_names(rng: random.Random, count: int) -> list[str]:
    alphabet = ["<", ">", "(", ")", "a", "b::", "::", " ", ", ", "x<y>", "operator", "()"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(count)]


def test_bracket_split_parses_as_the_bracket_by_bracket_reader() -> None:
    rng = random.Random(7)
    names = NAMES + _random_names(rng, 3000)
    checked = balanced = 0
    for name in names:
        if "operator" in name:
            continue
        checked += 1
        parsed = html._parse_brackets(name)
        assert parsed == html._parse_operators(name), name
        balanced += parsed is not None
    assert checked > 500 and balanced > 100
    # Names with `operator` in them take the bracket-by-bracket reader.
    assert html._parse_brackets("operator< <int>(a<b>)") == [
        "operator< ",
        ("<", ["int"]),
        ("(", ["a", ("<", ["b"])]),
    ]


def test_short_kernel_names_cached_as_computed() -> None:
    rng = random.Random(11)
    names = NAMES + ["void " + n * 5 for n in NAMES] + _random_names(rng, 500)
    for width in (80, 30, 8):
        for name in names:
            expected = html._short_kernel_name(name, width)
            assert html.short_kernel_name(name, width) == expected
            assert html.short_kernel_name(name, width) == expected  # from the cache
    assert len(html._SHORT_NAMES) <= html._SHORT_NAMES_KEPT


def test_short_name_cache_stays_bounded(monkeypatch) -> None:
    monkeypatch.setattr(html, "_SHORT_NAMES", {})
    monkeypatch.setattr(html, "_SHORT_NAMES_KEPT", 10)
    for i in range(35):
        name = f"void k<{i}, " + "x" * 100 + ">(int)"
        assert html.short_kernel_name(name) == html._short_kernel_name(name, 80)
        assert len(html._SHORT_NAMES) <= 10


def _place_labels_reference(
    labels: Sequence[tuple[float, float, float, str]],
    size: float,
    box: plot.Rect,
    taken: list[plot.Rect],
    segments: Sequence[tuple[float, float, float, float]] = (),
) -> list[plot.Placed]:
    """plot.place_labels as it was: every spot's cost summed over `_overlaps` calls."""
    out: list[plot.Placed] = []
    number = 0
    pad = 2.0

    def cost(rect: plot.Rect) -> int:
        padded = (rect[0] - pad, rect[1] - pad, rect[2] + pad, rect[3] + pad)
        return sum(plot._overlaps(padded, t) for t in taken) + sum(
            plot._crosses(rect, g) for g in segments
        )

    def inside(rect: plot.Rect) -> bool:
        return rect[0] >= box[0] and rect[2] <= box[2] and rect[1] >= box[1] and rect[3] <= box[3]

    for x, y, r, text in labels:
        placed = None
        for cx, cy, anchor in plot._label_spots(x, y, r, size, numbered=False):
            rect = plot.text_box(cx, cy, text, size, anchor)
            if inside(rect) and cost(rect) == 0:
                placed = plot.Placed(cx, cy, anchor, text, 0, cy != y + size * 0.35)
                taken.append(rect)
                break
        if placed is None:
            number += 1
            shown = str(number)
            best = None
            for cx, cy, anchor in plot._label_spots(x, y, r, size, numbered=True):
                rect = plot.text_box(cx, cy, shown, size, anchor)
                if not inside(rect):
                    continue
                c = cost(rect)
                if best is None or c < best[0]:
                    best = (c, cx, cy, anchor, rect)
                if c == 0:
                    break
            if best is None:
                cx, cy, anchor = x + r + 2, y + size * 0.35, "start"
                rect = plot.text_box(cx, cy, shown, size, anchor)
            else:
                _, cx, cy, anchor, rect = best
            far = abs(cy - (y + size * 0.35)) > size or abs(cx - x) > r + 12
            placed = plot.Placed(cx, cy, anchor, text, number, far)
            taken.append(rect)
        out.append(placed)
    return out


def _crowd(rng: random.Random) -> tuple[list, plot.Rect, list[plot.Rect], list]:
    box = (0.0, 0.0, rng.uniform(100, 400), rng.uniform(80, 300))
    labels = [
        (
            rng.uniform(0, box[2]),
            rng.uniform(0, box[3]),
            rng.uniform(2, 6),
            "k" * rng.randint(1, 20),
        )
        for _ in range(rng.randint(1, 40))
    ]
    taken = []
    for _ in range(rng.randint(0, 40)):
        x, y = rng.uniform(0, box[2]), rng.uniform(0, box[3])
        taken.append((x, y, x + rng.uniform(1, 30), y + rng.uniform(1, 12)))
    segments = [
        tuple(rng.uniform(0, box[2 if i % 2 == 0 else 3]) for i in range(4))
        for _ in range(rng.randint(0, 4))
    ]
    return labels, box, taken, segments


def test_label_placement_as_with_the_overlap_calls() -> None:
    rng = random.Random(3)
    numbered = 0
    for _ in range(300):
        labels, box, taken, segments = _crowd(rng)
        got_taken, want_taken = list(taken), list(taken)
        got = plot.place_labels(labels, plot.LABEL_SIZE, box, got_taken, segments)
        want = _place_labels_reference(labels, plot.LABEL_SIZE, box, want_taken, segments)
        assert got == want
        assert got_taken == want_taken
        numbered += sum(1 for p in got if p.number)
    assert numbered > 50  # the crowded path (numbers, least overlap) is exercised


def test_text_spot_as_with_the_overlap_calls() -> None:
    rng = random.Random(5)
    moved = 0
    for _ in range(500):
        _, box, taken, segments = _crowd(rng)
        m = plot.Text(
            rng.uniform(0, box[2]),
            rng.uniform(0, box[3]),
            "label" * rng.randint(1, 3),
            avoid=tuple(
                (rng.uniform(0, box[2]), rng.uniform(-20, 20), rng.uniform(-20, 20), "start")
                for _ in range(rng.randint(0, 5))
            ),
        )
        got = plot.text_spot(m, float, float, taken, segments, box)
        spots = [(m.x + m.dx, m.y + m.dy, m.anchor)] + [
            (x + dx, m.y + dy, anchor) for x, dx, dy, anchor in m.avoid
        ]
        want = spots[0]
        if len(spots) > 1:
            for x, y, anchor in spots:
                rect = plot.text_box(x, y, m.text, m.size, anchor)
                inside = (
                    rect[0] >= box[0]
                    and rect[2] <= box[2]
                    and rect[1] >= box[1]
                    and rect[3] <= box[3]
                )
                if (
                    inside
                    and not any(plot._overlaps(rect, t) for t in taken)
                    and not any(plot._crosses(rect, s) for s in segments)
                ):
                    want = (x, y, anchor)
                    break
        assert got == want
        moved += got != spots[0]
    assert moved > 20


def _old_group_name(title: str, sections: Sequence[Section]) -> str:
    digest = hashlib.sha1(title.encode("utf-8", "surrogatepass"))
    for s in sections:
        digest.update(
            b"\x00"
            + s.title.encode("utf-8", "surrogatepass")
            + b"\x00"
            + s.html.encode("utf-8", "surrogatepass")
        )
    return "gp-" + digest.hexdigest()[:12]


def test_group_name_and_lone_surrogates_in_one_pass() -> None:
    plain = [Section("A", "a", "<p>a é</p>"), Section("B <b>", "b", "<p>𝄞 b</p>")]
    cases = {
        "none": ("report", plain),
        "title": ("report \ud800", plain),
        "section title": ("report", [Section("A\udfff", "a", "<p>a</p>"), plain[1]]),
        "section html": ("report", [plain[0], Section("B", "b", "<p>\udc80</p>")]),
    }
    for case, (title, sections) in cases.items():
        group, surrogates = bundle._group_and_surrogates(title, sections)
        assert group == _old_group_name(title, sections), case
        html_, may_hold = bundle._tabbed_html(title, sections)
        assert may_hold == (case != "none"), case
        assert html_ == bundle.tabbed_html(title, sections)
        got = bundle.report_bundle(title, sections)["text/html"]
        assert got == visible_surrogates(html_), case
        got.encode("utf-8")


def test_modules_table_and_icicle_with_their_cells_and_words_made_once() -> None:
    mb = analyze(load_trace(BERT)).modules
    assert mb is not None and mb.rows
    shown = modules._walk(mb, modules._Tree(mb))[: modules.MAX_ROWS]
    headers, right = modules._headers(mb)
    text_rows = [
        modules._cells(mb, item, depth) if isinstance(item, modules.ModuleRow) else ["group"]
        for depth, item in shown
    ]
    assert modules._html_table(mb, shown, headers, right, text_rows) == modules._html_table(
        mb, shown, headers, right
    )
    cache: dict[int, str] = {}

    def cached(r: modules.ModuleRow) -> str:
        return cache.setdefault(id(r), modules.row_words(r))

    assert modules.icicle_svg(mb, cached) == modules.icicle_svg(mb)
    section = modules.modules_section(mb)
    for r in mb.rows[:20]:
        assert modules.row_words(r) in section.text


def _old_fmt_us(us):
    """units.fmt_us as it was (math.isnan behind an isinstance test)."""
    if us is None or (isinstance(us, float) and math.isnan(us)):
        return "n/a"
    a = abs(us)
    if a >= 1e6:
        return f"{us / 1e6:.3g} s" if a < 1e7 else f"{us / 1e6:.1f} s"
    if a >= 1e3:
        return f"{us / 1e3:.3g} ms" if a < 1e5 else f"{us / 1e3:.0f} ms"
    if a >= 1:
        return f"{us:.3g} us"
    if a == 0:
        return "0 us"
    return f"{us * 1e3:.3g} ns"


def test_fmt_us_nan_test_as_before() -> None:
    values = [None, math.nan, -math.nan, np.float64("nan"), np.float32("nan"), 0, 0.0, 3, -2.5]
    values += [1e-3, 999.4, 1e3, 12345.6, 1e5, 1e6, 2.5e7, -1e8, np.float64(7.25), np.int64(12)]
    values += [math.inf, -math.inf]
    for v in values:
        assert units.fmt_us(v) == _old_fmt_us(v), v
    assert units.fmt_us(math.nan) == "n/a"
    assert units.fmt_us(np.float32("nan")) == "nan ns"  # not a float: formatted, as before


def test_names_longer_than_shown_are_not_kept(monkeypatch) -> None:
    # A damaged trace's megabyte-long name is shortened each time, not held after the report.
    monkeypatch.setattr(html, "_SHORT_NAMES", {})
    name = "void k<" + "x" * (html.MAX_SHOWN_CHARS + 1) + ">(int)"
    assert html.short_kernel_name(name) == html._short_kernel_name(name, 80)
    assert html._SHORT_NAMES == {}

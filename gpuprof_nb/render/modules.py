"""The Modules section: time per nn.Module along its path in the model, as an icicle chart
(inline SVG, hover for the numbers) over a table in tree order, where repeated blocks
(`layers.0`..`layers.23`) fold into one row with their count and spread and unfold in a
<details> element (no script). The text holds every row and number the HTML shows."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from gpuprof_nb.render import svg
from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.html import NUM_CELL, TEXT_CELL, esc, esc_inline, note, scroll_box
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_bytes, fmt_num, fmt_pct, fmt_us
from gpuprof_nb.results.modules import ModuleBreakdown, ModuleGroup, ModuleRow

# Rows shown (text and HTML alike), icicle rows drawn, modules named as the hottest.
MAX_ROWS = 400
MAX_DEPTH = 16
HOTTEST = 5
_WIDTH, _ROW_H, _TOP = 900, 18, 26
_PALETTE = ("#1f77b4", "#4c9bd0", "#2a6fa0", "#6aaed6", "#1b5e8c", "#87bfe0")
_OUTSIDE_COLOUR = "#b5b5b5"
_TAB = "Modules"


def _basis(mb: ModuleBreakdown) -> str:
    return "device time" if mb.on_device else "host time"


def row_words(r: ModuleRow) -> str:
    """One module's numbers in words (the icicle's hover text, and a line of the text)."""
    fwd = r.forward_device_us if r.on_device else r.forward_host_us
    bwd = r.backward_device_us if r.on_device else r.backward_host_us
    rc = r.recompute_device_us if r.on_device else r.recompute_host_us
    what = f" ({r.module_type})" if r.module_type else ""
    words = (
        f"{r.path}{what}: {fmt_us(r.time_us)} ({fmt_pct(r.share)}), own {fmt_us(r.self_time_us)}"
        f"; forward {fmt_us(fwd)}, backward {fmt_us(bwd)}"
    )
    if rc > 0:
        words += f", recompute {fmt_us(rc)}"
    words += f"; {fmt_num(r.calls)} call{'s' if r.calls != 1 else ''}"
    return words


def group_words(g: ModuleGroup) -> str:
    return (
        f"{g.pattern} x{g.count}: {fmt_us(g.time_us)} ({fmt_pct(g.share)}), mean "
        f"{fmt_us(g.mean_us)}, {fmt_us(g.min_us)} to {fmt_us(g.max_us)} (spread "
        f"{fmt_pct(g.spread)})"
    )


def _headers(mb: ModuleBreakdown) -> tuple[list[str], list[bool]]:
    headers = ["module", "type", "calls", "host fwd", "host bwd"]
    if mb.on_device:
        headers += ["device fwd", "device bwd", "kernels"]
    headers += ["idle", "allocated", "share"]
    right = [False, False] + [True] * (len(headers) - 2)
    return headers, right


def _cells(mb: ModuleBreakdown, r: ModuleRow, indent: int) -> list[str]:
    cells = [
        "  " * indent + (r.path[len(r.parent) + 1 :] if r.parent else r.path),
        r.module_type,
        fmt_num(r.calls),
        fmt_us(r.forward_host_us),
        fmt_us(r.backward_host_us + r.recompute_host_us),
    ]
    if mb.on_device:
        cells += [
            fmt_us(r.forward_device_us),
            fmt_us(r.backward_device_us + r.recompute_device_us),
            fmt_num(r.kernels),
        ]
    cells += [
        fmt_us(r.idle_us),
        fmt_bytes(r.bytes_allocated) if r.bytes_allocated is not None else "",
        fmt_pct(r.share),
    ]
    return cells


class _Tree:
    """The rows by parent, most time first, and the groups by the parent they fold under."""

    def __init__(self, mb: ModuleBreakdown) -> None:
        self.children: dict[str | None, list[ModuleRow]] = {}
        for r in mb.rows:
            self.children.setdefault(r.parent, []).append(r)
        for kids in self.children.values():
            kids.sort(key=lambda r: (-r.time_us, r.path))
        self.group_of: dict[str, ModuleGroup] = {}
        for g in mb.groups:
            for m in g.members:
                self.group_of[m] = g

    def items(self, parent: str | None) -> list[ModuleRow | ModuleGroup]:
        """The children of `parent`: rows, and each group once, where its first member
        (by time) would come."""
        out: list[ModuleRow | ModuleGroup] = []
        seen: set[str] = set()
        for r in self.children.get(parent, []):
            g = self.group_of.get(r.path)
            if g is None:
                out.append(r)
            elif g.pattern not in seen:
                seen.add(g.pattern)
                out.append(g)
        return out


def _walk(mb: ModuleBreakdown, tree: _Tree) -> list[tuple[int, ModuleRow | ModuleGroup]]:
    """(depth, row or group) in display order; a group is followed by its members and
    their subtrees (folded in the HTML)."""
    by_path = {r.path: r for r in mb.rows}
    out: list[tuple[int, ModuleRow | ModuleGroup]] = []

    def visit(parent: str | None, depth: int) -> None:
        for item in tree.items(parent):
            out.append((depth, item))
            if isinstance(item, ModuleGroup):
                for m in item.members:
                    out.append((depth + 1, by_path[m]))
                    visit(m, depth + 2)
            else:
                visit(item.path, depth + 1)

    visit(None, 0)
    return out


def modules_section(mb: ModuleBreakdown) -> Section:
    """Return the Modules section (see the module docstring)."""
    if not mb.rows:
        text = "No module times: " + "; ".join(mb.notes)
        return Section(_TAB, text, note(text))
    basis = _basis(mb)
    outside = mb.outside_us / mb.total_us if mb.total_us else 0.0
    head = (
        f"Time per nn.Module ({basis}: forward, and the backward ops autograd tied to it), "
        f"{fmt_us(mb.total_us)} in all"
        + (f" over {fmt_num(mb.steps)} steps" if mb.steps > 1 else "")
        + f"; {fmt_us(mb.outside_us)} ({fmt_pct(outside)}) in no module."
    )
    hot = [r for r in mb.top(HOTTEST) if r.self_time_us > 0]
    hot_lines = [
        f"`{r.path}`: {fmt_pct(r.self_share)} of {basis} its own ({fmt_us(r.self_time_us)})"
        for r in hot
    ]
    text_parts = [head]
    html_parts = [f"<p>{esc(head)}</p>"]
    if hot_lines:
        lead = "Most time of their own:"
        text_parts.append(lead + "\n" + "\n".join(f"  {h}" for h in hot_lines))
        html_parts.append(
            f"<p>{esc(lead)}</p><ul>"
            + "".join(f"<li>{_breakable(esc_inline(h))}</li>" for h in hot_lines)
            + "</ul>"
        )
    tree = _Tree(mb)
    walked = _walk(mb, tree)
    shown = walked[:MAX_ROWS]
    # row_words of each row, made once: the icicle's hover titles and the text both use them.
    words: dict[int, str] = {}

    def words_of(r: ModuleRow) -> str:
        w = words.get(id(r))
        if w is None:
            w = words[id(r)] = row_words(r)
        return w

    drawn = icicle_svg(mb, words_of)
    html_parts.append(
        f"<p>{esc(basis.capitalize())} by module (wider = more time; hover for numbers):</p>"
        + svg.plot_html(drawn)
    )
    headers, right = _headers(mb)
    text_rows: list[list[str]] = []
    for depth, item in shown:
        if isinstance(item, ModuleGroup):
            cells = ["  " * depth + f"{item.pattern} x{item.count}"] + [""] * (len(headers) - 2)
            cells.append(fmt_pct(item.share))
            text_rows.append(cells)
        else:
            text_rows.append(_cells(mb, item, depth))
    text_parts.append(text_table(headers, text_rows, right=right))
    groups_shown = [item for _, item in shown if isinstance(item, ModuleGroup)]
    if groups_shown:
        text_parts.append(
            "Repeated blocks (folded in the HTML table):\n"
            + "\n".join(f"  {group_words(g)}" for g in groups_shown)
        )
    html_parts.append(_html_table(mb, shown, headers, right, text_rows))
    rows_shown = [item for _, item in shown if isinstance(item, ModuleRow)]
    text_parts.append("Each module:\n" + "\n".join(f"  {words_of(r)}" for r in rows_shown))
    if len(walked) > MAX_ROWS:
        more = f"{len(walked) - MAX_ROWS} more rows in .modules.rows"
        text_parts.append(more)
        html_parts.append(note(more))
    for x in mb.notes:
        text_parts.append(f"Note: {x}")
        html_parts.append(note(f"Note: {x}"))
    return Section(_TAB, "\n\n".join(text_parts), "".join(html_parts))


def _cell_style(right: bool) -> str:
    """A cell's class and inline alignment (as html_table gives them: a sanitizer strips the
    report's style, and JupyterLab's own CSS right-aligns every cell)."""
    return ' class="num"' + NUM_CELL if right else TEXT_CELL


_CODE = re.compile(r"<code>(.*?)</code>")


def _breakable(html: str) -> str:
    """Return `html` with a line-break opportunity (<wbr>, which every sanitizer keeps) after
    each dot of a <code> module path: a deep model's path runs past the output's width and
    has no space to wrap at."""
    return _CODE.sub(lambda m: "<code>" + m.group(1).replace(".", ".<wbr>") + "</code>", html)


def _tr(cells: Sequence[str], right: Sequence[bool], depth: int) -> str:
    out = []
    for i, c in enumerate(cells):
        if i == 0:
            out.append(
                f'<td class="name" style="text-align:left;padding-left:{depth * 0.9:.1f}em">'
                f"{esc(c.strip())}</td>"
            )
        else:
            out.append(f"<td{_cell_style(right[i])}>{esc(c)}</td>")
    return "<tr>" + "".join(out) + "</tr>"


def _html_table(
    mb: ModuleBreakdown,
    shown: Sequence[tuple[int, ModuleRow | ModuleGroup]],
    headers: Sequence[str],
    right: Sequence[bool],
    text_rows: Sequence[Sequence[str]] | None = None,
) -> str:
    """The HTML table of the rows `shown`; `text_rows` (the text table's rows, one per item
    shown) saves formatting each row's cells again: a row's cells differ from the text's
    only by the indent of the first, which _tr strips."""
    head = "".join(
        f"<th{_cell_style(r)}>{esc(h)}</th>" for h, r in zip(headers, right, strict=True)
    )
    body: list[str] = []
    # Open groups: (depth of the group, the parts of its inner table).
    stack: list[tuple[int, ModuleGroup, list[str]]] = []

    def close_to(depth: int) -> None:
        while stack and stack[-1][0] >= depth:
            gdepth, g, inner = stack.pop()
            html = (
                f'<tr class="gp-group"><td colspan="{len(headers)}"{TEXT_CELL}><details><summary>'
                f"{esc(group_words(g))}</summary><table><thead><tr>{head}</tr></thead><tbody>"
                + "".join(inner)
                + "</tbody></table></details></td></tr>"
            )
            (stack[-1][2] if stack else body).append(html)

    for k, (depth, item) in enumerate(shown):
        close_to(depth)
        if isinstance(item, ModuleGroup):
            stack.append((depth, item, []))
        else:
            cells = text_rows[k] if text_rows is not None else _cells(mb, item, 0)
            (stack[-1][2] if stack else body).append(_tr(cells, right, depth))
    close_to(0)
    # In a box that scrolls inside the output where the table is wider (html.scroll_box).
    return scroll_box(
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def _layout(mb: ModuleBreakdown) -> list[tuple[ModuleRow, float, float]]:
    """Each row's [x0, x1) as fractions of the total: roots side by side, most time first,
    each row's children from its left edge."""
    children: dict[str | None, list[ModuleRow]] = {}
    for r in mb.rows:
        children.setdefault(r.parent, []).append(r)
    for kids in children.values():
        kids.sort(key=lambda r: (-r.time_us, r.path))
    whole = mb.total_us or 1.0
    out: list[tuple[ModuleRow, float, float]] = []
    todo: list[tuple[str | None, float]] = [(None, 0.0)]
    while todo:
        parent, x = todo.pop()
        for r in children.get(parent, ()):
            w = min(max(r.time_us / whole, 0.0), 1.0)
            out.append((r, x, x + w))
            todo.append((r.path, x))
            x += w
    return out


def icicle_svg(mb: ModuleBreakdown, words: Callable[[ModuleRow], str] = row_words) -> str:
    """Return the icicle: one band per depth, roots on top, each module as wide as its
    share of the total, then a grey block for the time in no module; a hover title on each
    block gives its numbers (the same words as the text). The root's data-blocks attribute
    counts the blocks drawn. `words` gives a row's hover words (row_words, or a cache of it)."""
    placed = _layout(mb)
    depth = min(max((r.depth for r, _, _ in placed), default=0) + 1, MAX_DEPTH)
    height = _TOP + depth * _ROW_H + 10
    n = svg.num
    body = [
        svg.text(
            _WIDTH / 2,
            15,
            f"{_basis(mb).capitalize()} by nn.Module (grey: in no module)",
            size=12,
            anchor="middle",
            extra=' font-weight="600"',
        )
    ]
    drawn = 0
    roots_end = 0.0
    for r, x0, x1 in placed:
        if r.parent is None:
            roots_end = max(roots_end, x1)
        w = (x1 - x0) * _WIDTH
        if r.depth >= MAX_DEPTH or w < 0.5:
            continue
        drawn += 1
        x, y = x0 * _WIDTH, _TOP + r.depth * _ROW_H
        colour = _PALETTE[r.depth % len(_PALETTE)]
        body.append(
            f'<g class="gp-module"><rect x="{n(x)}" y="{y}" width="{n(max(w - 0.5, 0.5))}" '
            f'height="{_ROW_H - 2}" fill="{colour}" fill-opacity="0.85">'
            + svg.title(words(r))
            + "</rect>"
        )
        chars = int((w - 6) / (0.58 * 10))
        if chars >= 4:
            label = r.name if len(r.name) <= chars else r.name[: chars - 1] + "…"
            body.append(svg.text(x + 3, y + 12, label, size=10, fill="#ffffff"))
        body.append("</g>")
    outside = mb.outside_us / mb.total_us if mb.total_us else 0.0
    if outside * _WIDTH >= 0.5:
        drawn += 1
        x = roots_end * _WIDTH
        outside_words = f"in no module: {fmt_us(mb.outside_us)} ({fmt_pct(outside)})"
        body.append(
            f'<g class="gp-module"><rect x="{n(x)}" y="{_TOP}" '
            f'width="{n(max(outside * _WIDTH - 0.5, 0.5))}" height="{_ROW_H - 2}" '
            f'fill="{_OUTSIDE_COLOUR}">' + svg.title(outside_words) + "</rect></g>"
        )
    head = svg.svg_open(
        _WIDTH, height, f"icicle chart of {_basis(mb)} by nn.Module", f' data-blocks="{drawn}"'
    )
    return head + "".join(body) + "</svg>"


@report_of.register
def _modules(mb: ModuleBreakdown) -> tuple[str, Sequence[Section]]:
    return "gpuprof_nb modules", [modules_section(mb)]

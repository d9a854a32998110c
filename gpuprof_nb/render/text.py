"""Plain-text rendering primitives: the reference every other rendering must agree with."""

from __future__ import annotations

from collections.abc import Sequence

from gpuprof_nb.render.limits import MAX_TABLE_ROWS, clip, hidden_rows


def text_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right: Sequence[bool] | None = None,
    max_width: int | None = None,
) -> str:
    """Return the rows as an aligned text table. `right[i]` right-aligns column i (numbers).
    Cells are never truncated unless `max_width` is given, and then only the widest column
    (or past MAX_SHOWN_CHARS; and past MAX_TABLE_ROWS rows, a line says how many are not
    shown: render/limits.py)."""
    cols = len(headers)
    cells = [[clip(str(c)) for c in headers]] + [
        [clip(str(c)) for c in r] for r in rows[:MAX_TABLE_ROWS]
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(cols)]
    if max_width is not None:
        total = sum(widths) + 2 * (cols - 1)
        if total > max_width:
            widest = max(range(cols), key=lambda i: widths[i])
            widths[widest] = max(len(headers[widest]), widths[widest] - (total - max_width))
    align = list(right) if right is not None else [False] * cols
    out = []
    for n, row in enumerate(cells):
        parts = []
        for i, cell in enumerate(row):
            if len(cell) > widths[i]:
                cell = cell[: max(widths[i] - 3, 0)] + "..."
            parts.append(cell.rjust(widths[i]) if align[i] else cell.ljust(widths[i]))
        out.append("  ".join(parts).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    if len(rows) > MAX_TABLE_ROWS:
        out.append(hidden_rows(len(rows) - MAX_TABLE_ROWS))
    return "\n".join(out)


def heading(title: str) -> str:
    """Return a title underlined with '='."""
    return f"{title}\n{'=' * len(title)}"

"""HTML rendering primitives. Everything interpolated is escaped (kernel names hold < and >).
Colours come from JupyterLab / VS Code CSS variables where they exist, so dark themes work."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gpuprof_nb.render.limits import MAX_SHOWN_CHARS, MAX_TABLE_ROWS, clip, hidden_rows

# Inline style used by every report. var(--jp-...) and var(--vscode-...) are the frontends'
# own theme variables; the literal after each comma is the fallback for nbviewer/GitHub/nbconvert
# (light page). `.gpuprof.gpuprof` outranks JupyterLab's
# `:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td` (which right-aligns every cell).
#
# The same HTML serves two kinds of viewer (docs/viewers.md):
# - with this style (a trusted notebook, nbconvert, nbviewer, VS Code): tabs made of radio
#   inputs and CSS (render/bundle.tabbed_html; the hiding rules sit inside @supports so a
#   browser without :has() shows every section instead of none), plots as inline SVG with
#   hover titles, the banner hidden;
# - through a sanitizer that strips <style>, <svg> and <input> (an untrusted notebook in
#   JupyterLab, GitHub): the banner first, every section one after the other under its
#   heading, plots as <img> (an SVG data URI), tables scrolling inside the output. What
#   only the styled view shows (tab bar, inline SVG) is `hidden="hidden"` and
#   `style="display:none"` (JupyterLab keeps both; an empty `hidden` it drops), and the
#   inline SVG sits in a closed <details> besides, so a sanitizer that keeps neither still
#   leaks none of its text. This style shows them with `!important`, which outranks both.
_TAB_COUNT = 12
_TAB_SHOW = ",\n".join(
    f".gpuprof .gp-tabs:has(> .gp-tabbar > .gp-tab:nth-of-type({i}) > input:checked)"
    f" > .gp-panels > .gp-panel:nth-of-type({i})"
    for i in range(1, _TAB_COUNT + 1)
)
STYLE = (
    """
.gpuprof { font-family: var(--jp-ui-font-family, system-ui, sans-serif); font-size: 13px;
  color: var(--jp-ui-font-color1, var(--vscode-editor-foreground, #1f1f1f));
  line-height: 1.4; }
.gpuprof h3 { color: inherit; margin: 4px 0 6px 0; font-size: 15px; }
.gpuprof h4 { color: inherit; margin: 8px 0 4px 0; font-size: 13px; }
.gpuprof table { border-collapse: collapse; margin: 4px 0 10px 0; color: inherit;
  background: transparent; }
.gpuprof.gpuprof table th, .gpuprof.gpuprof table td { padding: 2px 8px; text-align: left;
  vertical-align: top;
  border-bottom: 1px solid var(--jp-border-color2, var(--vscode-editorWidget-border, #ddd));
  color: inherit; }
.gpuprof.gpuprof table td.num, .gpuprof.gpuprof table th.num { text-align: right;
  font-variant-numeric: tabular-nums; }
.gpuprof table td.name { overflow-wrap: anywhere; min-width: 14em; max-width: 60em;
  font-family: var(--jp-code-font-family, var(--vscode-editor-font-family, monospace)); }
.gpuprof details > summary { font-weight: 600; cursor: pointer; margin: 6px 0; }
.gpuprof td.name details.gp-name > summary { font-weight: normal; margin: 0;
  word-break: break-all; }
.gpuprof table td.kname { min-width: 26em; }
.gpuprof td.name .gp-full { margin: 2px 0 4px 1em; font-size: 12px;
  color: var(--jp-ui-font-color2, var(--vscode-descriptionForeground, #555)); }
.gpuprof .note { color: var(--jp-ui-font-color2, var(--vscode-descriptionForeground, #555)); }
.gpuprof .sev-high { color: var(--jp-error-color1, var(--vscode-errorForeground, #c62828));
  font-weight: 600; }
.gpuprof .sev-medium { color: var(--jp-warn-color1, var(--vscode-editorWarning-foreground,
  #b26a00)); font-weight: 600; }
.gpuprof .sev-low, .gpuprof .sev-info { color: var(--jp-info-color1,
  var(--vscode-editorInfo-foreground, #1565c0)); }
.gpuprof pre, .gpuprof code { font-family: var(--jp-code-font-family,
  var(--vscode-editor-font-family, monospace)); }
.gpuprof pre { background: var(--jp-layout-color2, var(--vscode-textCodeBlock-background,
  #f5f5f5)); color: inherit; padding: 6px; overflow-x: auto; }
.gpuprof img { max-width: 100%; background: white; }
.gpuprof .gp-banner { display: none; }
.gpuprof .gp-scroll { overflow-x: auto; max-width: 100%; }
.gpuprof .gp-plot { display: block !important; margin: 4px 0; }
.gpuprof details.gp-plot::details-content { content-visibility: visible; display: block; }
.gpuprof details.gp-plot > summary { display: none; }
.gpuprof img.gp-plot-img { display: none; }
@supports not selector(::details-content) {
.gpuprof .gp-plot { display: none !important; }
.gpuprof img.gp-plot-img { display: inline; }
}
.gpuprof svg.gp-svg { max-width: 100%; height: auto; overflow: visible; }
.gpuprof svg.gp-svg text { white-space: pre; }
.gpuprof a { color: var(--jp-content-link-color, var(--vscode-textLink-foreground, #1565c0)); }
.gpuprof .gp-tabs { margin-top: 2px; }
.gpuprof .gp-tab { display: inline-block; padding: 3px 12px; margin: 0 2px 0 0;
  cursor: pointer; user-select: none; color: inherit;
  border: 1px solid var(--jp-border-color1, var(--vscode-editorWidget-border, #bbb));
  border-bottom: none; border-radius: 4px 4px 0 0;
  background: var(--jp-layout-color2, var(--vscode-editorWidget-background, #eee)); }
.gpuprof .gp-tab > input { position: absolute; opacity: 0; width: 1px; height: 1px;
  margin: 0; pointer-events: none; }
.gpuprof .gp-panel { padding: 6px 2px 2px 2px;
  border-top: 1px solid var(--jp-border-color1, var(--vscode-editorWidget-border, #bbb)); }
@supports selector(:has(a)) {
.gpuprof .gp-tabbar { display: block !important; }
.gpuprof .gp-panel { display: none; }
.gpuprof .gp-h { display: none; }
.gpuprof .gp-tab:has(> input:checked) { font-weight: 600;
  background: var(--jp-layout-color0, var(--vscode-editor-background, #fff));
  border-color: var(--jp-brand-color1, var(--vscode-focusBorder, #1976d2)); }
.gpuprof .gp-tab:has(> input:focus-visible) {
  outline: 2px solid var(--jp-brand-color1, var(--vscode-focusBorder, #1976d2)); }
.gpuprof .gp-tabs:not(:has(> .gp-tabbar > .gp-tab > input:checked))
  > .gp-panels > .gp-panel:first-of-type,
"""
    + _TAB_SHOW
    + """ { display: block; }
}
"""
)


def esc(value: object) -> str:
    """Return str(value) escaped for HTML text and attributes, cut for display past
    MAX_SHOWN_CHARS (render/limits.py): html.escape(clip(str(value)), quote=True), its
    replacements written out (a report escapes thousands of cells)."""
    text = value if type(value) is str else str(value)
    if len(text) > MAX_SHOWN_CHARS:
        text = clip(text)
    return (
        text.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&quot;")
        .replace("'", "&#x27;")
    )


_BACKTICKED = re.compile(r"`([^`\n]+)`")


def esc_inline(value: object) -> str:
    """Return str(value) escaped for HTML text, with each `quoted` span (a line of code or
    a label, as the text form writes it) shown as <code>."""
    return _BACKTICKED.sub(r"<code>\1</code>", esc(value))


# Widest short name shown in a table cell (characters), before the full name is a click away.
SHORT_NAME_WIDTH = 80
_OPERATOR = re.compile(r"operator\s*(?:\(\)|\[\]|->\*?|<=>|<<=?|>>=?|[-+*/%^&|~!=<>,]=?)")
# `f() const::{lambda...}`: `const` there is a qualifier of f, not a namespace.
_QUALIFIER = re.compile(r"\b(?!const::)(?:\w+::)+")
_PAIRS = {"<": ">", "(": ")"}
# What _parse_brackets stops at: a bracket, or `operator` where a word starts.
_BRACKET_OR_OPERATOR = re.compile(r"[<>()]|(?<!\w)operator")
# `f(...)::{lambda()#1}::operator()() const::{lambda(...)#2}`: lambdas nested in a function.
_LAMBDAS = re.compile(
    r"(?:::\{lambda\((?:\.\.\.)?\)#\d+\}(?:::operator\(\)\((?:\.\.\.)?\)(?: const)?)?)+"
)


def _unqualified(text: str) -> str:
    """Return `text` without namespace qualifiers (_QUALIFIER: only where a '::' is)."""
    return _QUALIFIER.sub("", text) if "::" in text else text


def _lambdas_shortened(text: str) -> str:
    """Return `text` with each chain of lambdas as '::{lambda}' (_LAMBDAS: only where one is;
    the search for the words is many times faster than the pattern's)."""
    return _LAMBDAS.sub("::{lambda}", text) if "::{lambda(" in text else text


# Splits a name into its text pieces and, between them, its brackets.
_BRACKET = re.compile(r"([<>()])")


def _parse_brackets(name: str) -> list[Any] | None:
    """Return the name as a list of text pieces and (opener, children) groups for its <...>
    and (...) brackets; None when they do not balance (then the caller only cuts). A name
    with no `operator` in it (nearly all) is split at every bracket in one regex pass;
    `_parse_operators` reads the others."""
    if "operator" in name:
        return _parse_operators(name)
    root: list[Any] = []
    stack: list[tuple[str, list[Any]]] = []
    out = root
    pieces = iter(_BRACKET.split(name))
    text = next(pieces)
    # The pieces alternate text, bracket, text, ..., text (a text may be empty).
    for token, after in zip(pieces, pieces, strict=False):
        if token == "<" or token == "(":
            if text:
                out.append(text)
            group: list[Any] = []
            out.append((token, group))
            stack.append((token, out))
            out = group
        else:
            if not stack or _PAIRS[stack[-1][0]] != token:
                return None
            if text:
                out.append(text)
            out = stack.pop()[1]
        text = after
    if stack:
        return None
    if text:
        out.append(text)
    return root


def _parse_operators(name: str) -> list[Any] | None:
    """_parse_brackets of a name that may hold `operator()` or `operator<` (names, not
    brackets). Jumps from one bracket (or `operator` at a word's start) to the next: kernel
    names run to thousands of characters."""
    root: list[Any] = []
    stack: list[tuple[str, list[Any]]] = []
    out, text, i = root, "", 0
    while True:
        found = _BRACKET_OR_OPERATOR.search(name, i)
        if found is None:
            text += name[i:]
            break
        at, token = found.start(), found.group(0)
        text += name[i:at]
        i = found.end()
        if token == "operator":
            # `operator()` and `operator<` are names, not brackets.
            op = _OPERATOR.match(name, at)
            if op:
                i = op.end()
            text += name[at:i]
        elif token in _PAIRS:
            if text:
                out.append(text)
            group: list[Any] = []
            out.append((token, group))
            stack.append((token, out))
            out, text = group, ""
        else:
            if not stack or _PAIRS[stack[-1][0]] != token:
                return None
            if text:
                out.append(text)
            out, text = stack.pop()[1], ""
    if stack:
        return None
    if text:
        out.append(text)
    return root


def _collapsed(parts: list[Any], depth: int) -> str:
    """Return template arguments with brackets nested deeper than `depth` shown as <...> or
    (...), namespace qualifiers dropped ('at::native::CUDAFunctor_add' -> 'CUDAFunctor_add')
    and a chain of lambdas as '::{lambda}'."""
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(_unqualified(part))
            continue
        opener, children = part
        if not children:
            inner = ""
        elif depth > 1 and opener == "<":
            inner = _collapsed(children, depth - 1)
        else:
            inner = "..."
        out.append(opener + inner + _PAIRS[opener])
    return _lambdas_shortened("".join(out)).strip()


# short_kernel_name of the names met so far: a report shows the same kernel in several
# tables (Kernels, Roofline). Emptied when full, and only names up to MAX_SHOWN_CHARS are
# kept, so what it holds after the reports are gone stays a few MB at most.
_SHORT_NAMES: dict[tuple[str, int], str] = {}
_SHORT_NAMES_KEPT = 1024


def short_kernel_name(name: str, width: int = SHORT_NAME_WIDTH) -> str:
    """Return a C++ kernel name cut to at most `width` characters for a table cell: no
    'void ' prefix, the parameter list as (...), template arguments kept one level deep
    (deeper brackets as <...>) and shortened, then cut with '…'. Names that fit are returned
    as they are (less 'void ')."""
    if len(name) > MAX_SHOWN_CHARS:
        return _short_kernel_name(name, width)
    key = (name, width)
    short = _SHORT_NAMES.get(key)
    if short is None:
        if len(_SHORT_NAMES) >= _SHORT_NAMES_KEPT:
            _SHORT_NAMES.clear()
        short = _SHORT_NAMES[key] = _short_kernel_name(name, width)
    return short


def _short_kernel_name(name: str, width: int) -> str:
    full = name.strip()
    if full.startswith("void "):
        full = full[5:].lstrip()
    if len(full) <= width:
        return full
    parts = _parse_brackets(full.replace("(anonymous namespace)::", ""))
    if parts is not None:
        # The first template argument list is where kernels differ (the functor, the tile
        # shape); the outer name keeps its namespace only while everything fits.
        firsts = [i for i, p in enumerate(parts) if isinstance(p, tuple) and p[0] == "<"]
        first = firsts[0] if firsts else None
        # The first list collapsed to each depth, once (shown asks for it qualified or not).
        collapsed: dict[int, str] = {}

        def shown(qualified: bool, depth: int, budget: int | None = None) -> str:
            out = []
            for i, part in enumerate(parts):
                if isinstance(part, str):
                    out.append(part if qualified else _unqualified(part))
                    continue
                opener, children = part
                if i == first:
                    inner = collapsed.get(depth)
                    if inner is None:
                        inner = collapsed[depth] = _collapsed(children, depth)
                else:
                    inner = "..." if children else ""
                if budget is not None and i == first and len(inner) > budget:
                    # Never end inside a '<...>' or '(...)' that was cut.
                    cut = re.sub(r"[<(]\.{0,3}$", "", inner[: max(budget - 1, 0)])
                    inner = cut.rstrip(", ") + "…"
                out.append(opener + inner + _PAIRS[opener])
            return _lambdas_shortened("".join(out))

        # Template arguments say more than namespaces: drop the namespace before a level.
        for depth in (3, 2, 1):
            for qualified in (True, False):
                text = shown(qualified, depth)
                if len(text) <= width:
                    return text
        bare = shown(False, 1, 0)
        # What is left for the first template list once the rest is in place.
        budget = width - (len(bare) - 1)
        if first is not None and budget >= 8:
            return shown(False, 1, budget)
        full = bare
    return full if len(full) <= width else full[: width - 1] + "…"


# Inline cell styles (sanitizers keep them: docs/viewers.md).
NUM_CELL = ' style="text-align:right;white-space:nowrap"'
TEXT_CELL = ' style="text-align:left"'


def html_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    numeric: Sequence[bool] | None = None,
    name_cols: Sequence[int] = (),
    short_cols: Sequence[int] = (),
    table_class: str = "",
) -> str:
    """Return an escaped HTML table. `numeric[i]` right-aligns column i; columns listed in
    `name_cols` wrap long names instead of truncating them. Cells of `short_cols` (kernel
    names, hundreds of characters of C++ templates) show `short_kernel_name` with the full
    name in the cell's title (hover) and in a <details> under it."""
    num = list(numeric) if numeric is not None else [False] * len(headers)

    def cls(i: int) -> str:
        names = []
        if num[i]:
            names.append("num")
        if i in name_cols:
            names.append("name")
        if i in short_cols:
            # Wide enough for a short name in about three lines.
            names.append("kname")
        klass = f' class="{" ".join(names)}"' if names else ""
        # Inline too, for a viewer that strips the report's style (JupyterLab's own CSS
        # right-aligns every cell and lets "98.7 us" break after the number).
        return klass + (NUM_CELL if num[i] else TEXT_CELL)

    # Each column's attributes, once (not per cell).
    attrs = [cls(i) for i in range(len(num))]
    head = "".join(f"<th{attrs[i]}>{esc(h)}</th>" for i, h in enumerate(headers))

    def cell(i: int, value: object) -> str:
        if i in short_cols:
            full = str(value)
            short = short_kernel_name(full)
            if short == full.removeprefix("void "):
                if short != full:
                    return f'<td{attrs[i]} title="{esc(full)}">{esc(short)}</td>'
            else:
                whole = esc(full)  # names of thousands of characters: escaped once
                return (
                    f'<td{attrs[i]} title="{whole}"><details class="gp-name">'
                    f'<summary>{esc(short)}</summary><div class="gp-full">{whole}</div>'
                    "</details></td>"
                )
        return f"<td{attrs[i]}>{esc(value)}</td>"

    shown = rows[:MAX_TABLE_ROWS]
    body = "".join("<tr>" + "".join(cell(i, c) for i, c in enumerate(r)) + "</tr>" for r in shown)
    if len(rows) > len(shown):
        body += (
            f'<tr><td colspan="{len(headers)}" class="note">'
            f"{esc(hidden_rows(len(rows) - len(shown)))}</td></tr>"
        )
    klass = f' class="{esc(table_class)}"' if table_class else ""
    return scroll_box(f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def scroll_box(html: str) -> str:
    """Return `html` in a box that scrolls sideways inside the output when it is wider (a
    table of long names at 948 px) instead of overflowing it; the inline style keeps it so
    where a sanitizer strips the report's <style> (JupyterLab keeps `overflow-x`)."""
    return f'<div class="gp-scroll" style="overflow-x:auto">{html}</div>'


def note(text: str) -> str:
    return f'<p class="note">{esc(text)}</p>'

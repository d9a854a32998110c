"""HTML rendering primitives. Everything interpolated is escaped (kernel names hold < and >).
Colours come from JupyterLab / VS Code CSS variables where they exist, so dark themes work."""

from __future__ import annotations

import base64
import html as _html
from collections.abc import Sequence

# Inline style used by every report. var(--jp-...) and var(--vscode-...) are the frontends'
# own theme variables; the literal after each comma is the fallback for nbviewer/GitHub.
STYLE = """
.gpuprof { font-family: var(--jp-ui-font-family, system-ui, sans-serif); font-size: 13px;
  color: var(--jp-ui-font-color1, var(--vscode-editor-foreground, #1f1f1f)); }
.gpuprof table { border-collapse: collapse; margin: 4px 0 10px 0; }
.gpuprof th, .gpuprof td { padding: 2px 8px; text-align: left; vertical-align: top;
  border-bottom: 1px solid var(--jp-border-color2, var(--vscode-editorWidget-border, #ddd));
  color: inherit; background: transparent; }
.gpuprof td.num, .gpuprof th.num { text-align: right; font-variant-numeric: tabular-nums; }
.gpuprof td.name { word-break: break-all; max-width: 60em; font-family: var(--jp-code-font-family, monospace); }
.gpuprof details > summary { font-weight: 600; cursor: pointer; margin: 6px 0; }
.gpuprof .note { color: var(--jp-ui-font-color2, var(--vscode-descriptionForeground, #666)); }
.gpuprof .sev-high { color: var(--jp-error-color1, #c62828); font-weight: 600; }
.gpuprof .sev-medium { color: var(--jp-warn-color1, #b26a00); font-weight: 600; }
.gpuprof .sev-low, .gpuprof .sev-info { color: var(--jp-info-color1, #1565c0); }
.gpuprof pre { background: var(--jp-layout-color2, var(--vscode-textCodeBlock-background, #f5f5f5));
  color: inherit; padding: 6px; overflow-x: auto; }
.gpuprof img { max-width: 100%; background: white; }
"""


def esc(value: object) -> str:
    """Return str(value) escaped for HTML text and attributes."""
    return _html.escape(str(value), quote=True)


def html_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    numeric: Sequence[bool] | None = None,
    name_cols: Sequence[int] = (),
    table_class: str = "",
) -> str:
    """Return an escaped HTML table. `numeric[i]` right-aligns column i; columns listed in
    `name_cols` wrap long names instead of truncating them."""
    num = list(numeric) if numeric is not None else [False] * len(headers)

    def cls(i: int) -> str:
        names = []
        if num[i]:
            names.append("num")
        if i in name_cols:
            names.append("name")
        return f' class="{" ".join(names)}"' if names else ""

    head = "".join(f"<th{cls(i)}>{esc(h)}</th>" for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f"<td{cls(i)}>{esc(c)}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    klass = f' class="{esc(table_class)}"' if table_class else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def png_img(png: bytes, alt: str) -> str:
    """Return an <img> tag embedding PNG bytes as a data URI (works offline, no CDN)."""
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}"/>'


def note(text: str) -> str:
    return f'<p class="note">{esc(text)}</p>'

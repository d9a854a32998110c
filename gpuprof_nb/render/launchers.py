"""The Top ops tab's part on device work launched outside every torch op: by the runtime
call that launched it, and the user's line (with stacks). Text and HTML alike."""

from __future__ import annotations

from gpuprof_nb.render.html import esc, html_table, note
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_num, fmt_pct, fmt_us
from gpuprof_nb.results.tables import OpTable

HEADERS = (
    "runtime call",
    "your line",
    "calls",
    "kernels",
    "device time",
    "% of device",
    "host time",
)
NUMERIC = (False, False, True, True, True, True, True)


def launcher_rows(table: OpTable) -> list[tuple[str, ...]]:
    total = table.self_device_us + table.unattributed_device_us
    return [
        (
            r.name,
            r.line or "-",
            fmt_num(r.calls),
            fmt_num(r.kernels),
            fmt_us(r.device_us),
            fmt_pct(r.device_us / total if total > 0 else 0.0),
            fmt_us(r.host_us),
        )
        for r in table.launchers
    ]


def launcher_parts(table: OpTable) -> tuple[str, str]:
    """Return the text and HTML of the launchers' table ('' and '' without any)."""
    if not table.launchers:
        return "", ""
    lead = (
        f"Launched outside any torch op ({fmt_us(table.runtime_launched_us)} of device time), "
        "by the runtime call that launched it"
        + ("" if any(r.line for r in table.launchers) else " (your lines: profile with --stack)")
        + ":"
    )
    rows = launcher_rows(table)
    text = f"{lead}\n" + text_table(HEADERS, rows, right=NUMERIC)
    html = f"<p>{esc(lead)}</p>" + html_table(HEADERS, rows, numeric=NUMERIC, name_cols=(1,))
    rest = table.unattributed_device_us - table.runtime_launched_us
    if rest > 0.5:
        words = f"{fmt_us(rest)} of device time has no launch call in the trace"
        text += f"\n{words}"
        html += note(words)
    return text, html

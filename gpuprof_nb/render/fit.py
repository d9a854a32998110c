"""Will it fit, drawn: the peak by category as a stacked bar (inline SVG, beside the memory
timeline), the categories and activations by module as tables, and the batch-size
predictions, the largest batch under the budget and the checkpointing plan. Text and HTML
show the same digits."""

from __future__ import annotations

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.render import svg
from gpuprof_nb.render.html import esc, html_table, note
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_bytes, fmt_num, fmt_pct, fmt_us
from gpuprof_nb.results.fit import (
    OVERHEAD,
    BatchFit,
    CheckpointPlan,
    MemoryByCategory,
    Prediction,
)
from gpuprof_nb.results.report import MemoryReport

# Close to the colours PyTorch's own memory timeline gives these categories.
COLOURS = {
    "parameters": "#2e7d32",
    "gradients": "#1565c0",
    "optimizer state": "#daa520",
    "inputs": "#546e7a",
    "activations": "#c62828",
    "temporaries": "#9370db",
    "other": "#9e9e9e",
    OVERHEAD: "#d9d9d9",
}
_W, _H, _TOP, _BOTTOM = 300, 390, 28, 328
# Multiples of the recorded batch the table predicts.
MULTIPLES = (0.5, 2, 4, 8)


def _parts(mbc: MemoryByCategory) -> list[tuple[str, int]]:
    parts = [(c.category, c.bytes) for c in mbc.categories if c.bytes > 0]
    if mbc.allocator_overhead_bytes:
        parts.append((OVERHEAD, mbc.allocator_overhead_bytes))
    return parts


def category_svg(mbc: MemoryByCategory) -> str:
    """Return the peak as one stacked bar, bottom up in CATEGORIES order with the
    allocator's overhead on top, each part labelled with its bytes and hover title."""
    parts = _parts(mbc)
    total = sum(b for _, b in parts) or 1
    sy = svg.LinearScale(0.0, total * 1.04, _BOTTOM, _TOP)
    x0, width = 60.0, 56.0
    out = [
        svg.text(
            _W / 2, 16, "The peak by category", size=12, anchor="middle", extra=' font-weight="600"'
        ),
    ]
    base = 0.0
    label_y: list[float] = []
    for name, value in parts:
        y1, y0 = sy(base + value), sy(base)
        tip = f"{name}: {fmt_bytes(value)} ({fmt_pct(value / total)} of the bar)"
        out.append(
            f'<rect class="gp-cat" data-category="{esc(name)}" x="{svg.num(x0)}" '
            f'y="{svg.num(y1)}" width="{svg.num(width)}" height="{svg.num(max(y0 - y1, 0))}" '
            f'fill="{COLOURS[name]}">' + svg.title(tip) + "</rect>"
        )
        # Labels at the middle of their part, pushed apart so none overlap.
        y = (y0 + y1) / 2 + 4
        if label_y and y > label_y[-1] - 13:
            y = label_y[-1] - 13
        label_y.append(y)
        out.append(
            f'<path d="M{svg.num(x0 + width)} {svg.num((y0 + y1) / 2)}L{svg.num(x0 + width + 8)} '
            f'{svg.num(y - 4)}" stroke="currentColor" stroke-opacity="0.4"/>'
        )
        out.append(svg.text(x0 + width + 11, y, f"{name} {fmt_bytes(value)}", size=10, tip=tip))
        base += value
    out.append(
        f'<path d="M{svg.num(x0 - 4)} {_BOTTOM}H{svg.num(x0 + width + 4)}" '
        'stroke="currentColor" stroke-opacity="0.6"/>'
    )
    out.append(
        svg.text(
            x0 + width / 2,
            _BOTTOM + 16,
            f"peak {fmt_bytes(mbc.peak_bytes)}",
            size=10,
            anchor="middle",
        )
    )
    if mbc.allocator_overhead_bytes:
        out.append(
            svg.text(
                x0 + width / 2,
                _BOTTOM + 30,
                f"reserved {fmt_bytes(total)}",
                size=10,
                anchor="middle",
            )
        )
    head = svg.svg_open(_W, _H, "the peak by category as a stacked bar", f' data-total="{total}"')
    return head + "".join(out) + "</svg>"


def _category_rows(mbc: MemoryByCategory) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [
        (c.category, fmt_bytes(c.bytes), fmt_pct(c.share), fmt_num(c.blocks))
        for c in mbc.categories
    ]
    rows.append(("peak (their sum)", fmt_bytes(mbc.total_bytes), fmt_pct(1.0), ""))
    if mbc.allocator_overhead_bytes is not None:
        rows.append((OVERHEAD, fmt_bytes(mbc.allocator_overhead_bytes), "", ""))
    return rows


def category_line(mbc: MemoryByCategory) -> str:
    """The bar's numbers in one line of text (what the timeline's text shows beside it)."""
    return "By category at the peak: " + ", ".join(
        f"{name} {fmt_bytes(value)}" for name, value in _parts(mbc)
    )


def categories_section(report: MemoryReport) -> Section:
    """Return the By category section: the bar, the categories, activations by module
    and by allocation site."""
    mbc = report.by_category
    assert mbc is not None
    head = (
        f"The peak ({fmt_bytes(mbc.peak_bytes)}) by category; tensors told apart by {mbc.method}."
    )
    hdr = ("category", "bytes", "share", "blocks")
    num = (False, True, True, True)
    rows = _category_rows(mbc)
    mod_rows = [
        (m.path, m.type_name, fmt_bytes(m.bytes), fmt_pct(m.share), fmt_num(m.blocks))
        for m in mbc.activations_by_module
    ]
    mod_hdr = ("module", "type", "activations", "share", "blocks")
    mod_num = (False, False, True, True, True)
    site_rows = [
        (r.site.label, fmt_bytes(r.bytes), fmt_pct(r.share), fmt_num(r.blocks))
        for r in mbc.activations_by_site[:10]
    ]
    site_hdr = ("allocation site", "activations", "share", "blocks")
    text = [head, text_table(hdr, rows, right=num)]
    html = [
        svg.plot_html(category_svg(mbc)),
        f"<p>{esc(head)}</p>",
        html_table(hdr, rows, numeric=num),
    ]
    if mod_rows:
        line = "Activations saved for backward, by the module whose forward made them:"
        text += [line, text_table(mod_hdr, mod_rows, right=mod_num)]
        html += [
            f"<p>{esc(line)}</p>",
            html_table(mod_hdr, mod_rows, numeric=mod_num, name_cols=(0,)),
        ]
    if site_rows:
        line = "Activations by allocation site:"
        text += [line, text_table(site_hdr, site_rows, right=(False, True, True, True))]
        html += [
            f"<p>{esc(line)}</p>",
            html_table(site_hdr, site_rows, numeric=(False, True, True, True), name_cols=(0,)),
        ]
    for msg in mbc.notes:
        text.append(f"Note: {msg}")
        html.append(note(f"Note: {msg}"))
    return Section("By category", "\n".join(text), "".join(html))


def _prediction_row(label: str, p: Prediction) -> tuple[str, ...]:
    return (
        label,
        fmt_bytes(p.peak_bytes),
        f"{fmt_bytes(p.low_bytes)} - {fmt_bytes(p.high_bytes)}",
        fmt_bytes(p.reserved_bytes) if p.reserved_bytes is not None else "",
    )


def _predictions(fit: BatchFit) -> tuple[list[tuple[str, ...]], str]:
    ref = fit.batch_size
    rows: list[tuple[str, ...]] = []
    last: Prediction | None = None
    sizes: list[tuple[str, int, int | None]] = []
    for m in (1, *MULTIPLES):
        if ref is not None:
            b = max(int(round(ref * m)), 1)
            sizes.append((f"{fmt_num(b)} ({fmt_num(m)}x)", b, None))
        else:
            # Without the recorded size, multiples of it: batch m*2 against a recording of 2.
            sizes.append((f"{fmt_num(m)}x the recorded batch", int(round(2 * m)), 2))
    for label, b, recorded in sorted(sizes, key=lambda s: s[1]):
        p = fit.predict(b, recorded_batch_size=recorded)
        rows.append(_prediction_row(label, p))
        last = p
    return rows, last.uncertainty if last is not None else ""


def fit_section(report: MemoryReport) -> Section:
    """Return the Will it fit section: predicted peaks at other batch sizes, the largest
    batch under the budget, and the checkpointing plan."""
    fit = report.fit
    text: list[str] = []
    html: list[str] = []
    if fit is None:
        msg = (
            "Nothing here tells which memory grows with the batch: record the cell with "
            "%%memsnap --fit VAR (VAR: the batch-size variable the cell reads)."
        )
        return Section("Will it fit", msg, note(msg))
    if fit.method == "two runs":
        head = (
            f"Measured at two batch sizes: {fmt_num(fit.other_batch_size)} (peak "
            f"{fmt_bytes(fit.other_measured_peak_bytes)}) and {fmt_num(fit.batch_size)} "
            f"(peak {fmt_bytes(fit.measured_peak_bytes)}), {fit.variable or 'the batch'} "
            f"set by %%memsnap --fit; {fmt_pct(fit.matched_share)} of the allocated bytes "
            "matched between the runs."
        )
    else:
        head = (
            "From one recording: activations, inputs and the temporaries of forward and "
            "backward are assumed to grow in proportion to the batch (record with "
            "%%memsnap --fit VAR to measure it)."
        )
    rows, words = _predictions(fit)
    hdr = ("batch size", "predicted peak", "interval", "reserved (with overhead)")
    num = (False, True, True, True)
    text += [head, text_table(hdr, rows, right=num), f"Interval: {words}"]
    html += [
        f"<p>{esc(head)}</p>",
        html_table(hdr, rows, numeric=num),
        f"<p>Interval: {esc(words)}</p>",
    ]
    if report.budget_bytes is not None:
        try:
            best = report.largest_batch()
            safe = report.largest_batch(conservative=True)
        except GpuprofError:  # the fit does not know its batch size
            best = safe = None
            line = (
                f"Budget {fmt_bytes(report.budget_bytes)}: the largest batch needs the "
                "recorded batch size (report.largest_batch(recorded_batch_size=...))."
            )
        else:
            if best is None:
                line = f"Budget {fmt_bytes(report.budget_bytes)}: not even batch size 1 fits."
            else:
                line = (
                    f"Budget {fmt_bytes(report.budget_bytes)}: the largest batch predicted "
                    f"to fit is {fmt_num(best)}"
                    + (f" ({fmt_num(safe)} at the top of the interval)" if safe != best else "")
                    + "."
                )
        src = f"Budget from {report.budget_source}." if report.budget_source else ""
        text += [line, src]
        html += [f"<p><b>{esc(line)}</b></p>", note(src) if src else ""]
    for msg in fit.notes:
        text.append(f"Note: {msg}")
        html.append(note(f"Note: {msg}"))
    if report.plan is not None:
        t, h = plan_parts(report.plan)
        text.append(t)
        html.append(h)
    return Section("Will it fit", "\n".join(s for s in text if s), "".join(html))


def plan_parts(plan: CheckpointPlan) -> tuple[str, str]:
    """Return the plan as text and HTML: verdict, modules, peaks, the code to paste."""
    if not plan.modules:
        verdict = (
            f"Checkpointing plan for {fmt_bytes(plan.budget_bytes)}: none needed, the peak "
            f"({fmt_bytes(plan.baseline_peak_bytes)}) fits."
            if plan.fits
            else f"Checkpointing plan for {fmt_bytes(plan.budget_bytes)}: no module to "
            "checkpoint would bring the peak under it."
        )
    else:
        verdict = (
            f"Checkpointing plan for {fmt_bytes(plan.budget_bytes)}: checkpoint "
            f"{len(plan.modules)} module(s); predicted peak "
            f"{fmt_bytes(plan.predicted_peak_bytes)} (from "
            f"{fmt_bytes(plan.baseline_peak_bytes)}), {fmt_us(plan.recompute_us)} of forward "
            f"recomputed per step"
            + (
                f" ({fmt_pct(plan.recompute_us / plan.forward_us)} of the forward)"
                if plan.forward_us
                else ""
            )
            + ("." if plan.fits else "; still over the budget.")
        )
    rows = [
        (m.path, m.type_name, fmt_bytes(m.saved_bytes), fmt_us(m.recompute_us), fmt_num(m.calls))
        for m in plan.modules
    ]
    hdr = ("module", "type", "activations freed", "recompute", "calls")
    num = (False, False, True, True, True)
    text = [verdict]
    html = [f"<p><b>{esc(verdict)}</b></p>"]
    if rows:
        text.append(text_table(hdr, rows, right=num))
        html.append(html_table(hdr, rows, numeric=num, name_cols=(0,)))
    if plan.measured_peak_bytes is not None:
        err = (
            plan.measured_peak_bytes / plan.predicted_peak_bytes - 1
            if plan.predicted_peak_bytes
            else 0
        )
        line = (
            f"Applied and measured: peak {fmt_bytes(plan.measured_peak_bytes)} against "
            f"{fmt_bytes(plan.predicted_peak_bytes)} predicted ({err * 100:+.1f}%); "
            + ("within" if plan.measured_peak_bytes <= plan.budget_bytes else "over")
            + " the budget."
        )
        text.append(line)
        html.append(f"<p>{esc(line)}</p>")
    line = f"Solver: {plan.solver}; {plan.candidates} candidate module(s)."
    text.append(line)
    html.append(note(line))
    for msg in plan.notes:
        text.append(f"Note: {msg}")
        html.append(note(f"Note: {msg}"))
    if plan.code:
        text.append("Paste this after building the model:\n" + plan.code)
        html.append(
            f"<p>Paste this after building the model:</p><pre><code>{esc(plan.code)}</code></pre>"
        )
    return "\n".join(text), "".join(html)

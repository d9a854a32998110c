"""The MFU rows of the Summary: model FLOPs utilisation first on GPU runs, with HFU beside
it under activation checkpointing, the FLOPs per step and the rate they ran at, where the
peak came from, the ops without a FLOP formula, samples and tokens per second."""

from __future__ import annotations

from gpuprof_nb.render.units import fmt_num, fmt_pct, fmt_rate, fmt_us
from gpuprof_nb.results.mfu import Mfu

# Ops without a formula named in the Summary row.
NAMED = 3


def mfu_pairs(m: Mfu) -> list[tuple[str, str]]:
    """Return the Summary rows (label, value) of an MFU result."""
    pairs: list[tuple[str, str]] = []
    origin = "measured" if m.measured_peak else "datasheet"
    if m.mfu is not None and m.peak_flops_per_s:
        pairs.append(
            (
                "MFU",
                f"{fmt_pct(m.mfu)} of the {m.roof} peak ({fmt_rate(m.peak_flops_per_s, 'FLOP/s')}, "
                f"{origin})",
            )
        )
        if m.hfu is not None:
            pairs.append(("HFU (with recompute)", fmt_pct(m.hfu)))
    else:
        why = next((n for n in m.notes if n.startswith("no MFU")), "")
        pairs.append(("MFU", why.removeprefix("no MFU: ") or "not shown (see the notes)"))
    pairs.append(
        (
            "model FLOPs per step",
            f"{fmt_rate(m.model_flops_per_step, 'FLOP')} in {fmt_us(m.step_us)} "
            f"({m.step_source}): {fmt_rate(m.achieved_flops_per_s, 'FLOP/s')}",
        )
    )
    if m.unformulated_share > 0:
        named = ", ".join(f"{u.name} {fmt_pct(u.share)}" for u in m.unformulated[:NAMED])
        basis = "device time" if m.on_device else "CPU time"
        pairs.append(
            (
                "ops without a FLOP formula",
                f"{fmt_pct(m.unformulated_share)} of {basis}" + (f" ({named})" if named else ""),
            )
        )
    if m.samples_per_s is not None:
        pairs.append(("samples per second", fmt_num(m.samples_per_s)))
    if m.tokens_per_s is not None:
        pairs.append(("tokens per second", fmt_num(m.tokens_per_s)))
    return pairs


def mfu_notes(m: Mfu) -> list[str]:
    """The MFU notes the Summary shows (the reason MFU is missing is in its row)."""
    notes = [n for n in m.notes if not n.startswith("no MFU")]
    if m.peak_source:
        notes.append(f"MFU peak: {m.peak_source}")
    return notes

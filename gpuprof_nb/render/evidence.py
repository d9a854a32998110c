"""One way to show a finding's evidence, for every tab that shows findings (Diagnosis,
the memory report's Findings): each evidence name ends with its unit, and the unit picks the
format. The vocabulary, suffix by suffix:

- `_us`: microseconds, shown as a duration; `_bytes`: bytes; `_bytes_per_s`: a rate;
- `_fraction`: a share in 0..1, shown as a percentage; `_ratio`: one quantity over another,
  shown as "2.5x";
- `_count`, `_per_step`: counts (per step: the label says so); `_version`: a version number
  such as a compute capability.
The unit leaves the label ("dataloader time" for `dataloader_time_us`): the value carries it.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuprof_nb.render.units import fmt_bytes, fmt_num, fmt_pct, fmt_rate, fmt_us

_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("_bytes_per_s", "B/s"),
    ("_fraction", "%"),
    ("_bytes", "bytes"),
    ("_us", "time"),
    ("_ratio", "x"),
    ("_per_step", "per step"),
    ("_count", "count"),
    ("_version", "version"),
)


def evidence_rows(evidence: Mapping[str, float]) -> list[tuple[str, str]]:
    """Return (label, formatted value) per evidence entry, the unit taken from the suffix."""
    rows = []
    for key, value in evidence.items():
        label, unit = key, ""
        for suffix, u in _SUFFIXES:
            if key.endswith(suffix):
                label, unit = key[: -len(suffix)], u
                break
        if unit == "B/s":
            shown = fmt_rate(value, "B/s")
        elif unit == "%":
            shown = fmt_pct(value)
        elif unit == "bytes":
            shown = fmt_bytes(value)
        elif unit == "time":
            shown = fmt_us(value)
        elif unit == "x":
            shown = fmt_num(value) + "x"
        else:
            shown = fmt_num(value)
        if unit == "per step":
            label += " per step"
        rows.append((label.replace("_", " "), shown, unit))
    # The same quantity often comes as time and as share: say which row is which.
    labels = [r[0] for r in rows]
    return [
        (f"{lab} (share)" if unit == "%" and labels.count(lab) > 1 else lab, shown)
        for lab, shown, unit in rows
    ]

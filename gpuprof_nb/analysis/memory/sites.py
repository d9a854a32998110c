"""Allocation sites: the user's line behind each recorded stack, and blocks grouped by site."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np

from gpuprof_nb.analysis.sources import source_label
from gpuprof_nb.model.frames import Frame
from gpuprof_nb.model.memory import OP_FILENAME, MemorySnapshot
from gpuprof_nb.results.memory import Site, SiteBytes

BEFORE_LABEL = "(allocated before recording)"
NO_STACK_LABEL = "(no stack recorded)"
OTHER_LABEL = "(other sites)"


def _is_python(frame: Frame) -> bool:
    fn = frame.file
    return fn.endswith(".py") or fn.startswith(("<ipython-input", "<string>", "<stdin>"))


def _is_internal(frame: Frame) -> bool:
    """True for frames of torch itself and of gpuprof_nb's own recording code."""
    return _internal_file(frame.file)


# Cached per file name: every frame of a file shares its name (see analysis/sources.py).
@functools.lru_cache(maxsize=4096)
def _internal_file(filename: str) -> bool:
    fn = filename.replace("\\", "/")
    return (
        fn.startswith(("torch/", "gpuprof_nb/"))
        or "/torch/" in fn
        or "/gpuprof_nb/" in fn
        or "/site-packages/torch" in fn
    )


def user_frame(frames: Sequence[Frame]) -> Frame | None:
    """Return the innermost Python frame outside torch (the user's line), falling back
    to the innermost Python frame, then the innermost frame; None for an empty stack."""
    python = [f for f in frames if _is_python(f)]
    for f in python:
        if not _is_internal(f):
            return f
    if python:
        return python[0]
    return frames[0] if frames else None


def _site_of(frame: Frame | None, cells: Mapping[str, int], first_line: bool) -> Site:
    if frame is None:
        return Site(NO_STACK_LABEL)
    label = source_label(frame.file, frame.line, frame.function, cells, first_line=first_line)
    return Site(label, frame.file, frame.line, frame.function)


def stack_sites(snapshot: MemorySnapshot) -> tuple[tuple[Site, ...], np.ndarray]:
    """Return the distinct sites and, per stack index, its site index (int32 array).
    Site 0 is always 'no stack recorded'; index a stack of -1 with position 0 too. A site
    in a notebook cell is named `In [n], line L` (see analysis/sources.py)."""
    sites: list[Site] = [Site(NO_STACK_LABEL)]
    index: dict[Site, int] = {sites[0]: 0}
    of_stack = np.zeros(len(snapshot.stacks) + 1, dtype=np.int32)
    for i, stack in enumerate(snapshot.stacks):
        frames = [snapshot.frames[j] for j in stack]
        # Profiler-made stacks (the CPU fallback) carry each Python function's first line,
        # not the calling line, unless exact line events gave it; the allocating op tells
        # sites on one line apart.
        profiler_made = bool(frames) and frames[0].file == OP_FILENAME
        site = _site_of(
            user_frame(frames), snapshot.cells, profiler_made and not snapshot.exact_lines
        )
        if profiler_made and site.label != NO_STACK_LABEL:
            site = Site(
                f"{site.label} [{frames[0].function}]", site.filename, site.line, site.function
            )
        k = index.setdefault(site, len(sites))
        if k == len(sites):
            sites.append(site)
        of_stack[i + 1] = k
    return tuple(sites), of_stack


def _category_name(snapshot: MemorySnapshot, code: int) -> str:
    return snapshot.categories[code] if 0 <= code < len(snapshot.categories) else ""


def _group(
    sites: tuple[Site, ...],
    site_idx: np.ndarray,
    sizes: np.ndarray,
    categories: Sequence[str],
    total: int,
    limit: int = 20,
) -> tuple[SiteBytes, ...]:
    """Group blocks by site: bytes, count, largest block, main category; largest first."""
    if len(site_idx) == 0:
        return ()
    per = np.bincount(site_idx, weights=sizes, minlength=len(sites))
    count = np.bincount(site_idx, minlength=len(sites))
    largest = np.zeros(len(sites), dtype=np.int64)
    np.maximum.at(largest, site_idx, sizes)
    cat_bytes: dict[int, dict[str, int]] = {}
    for k, c, b in zip(site_idx.tolist(), categories, sizes.tolist(), strict=True):
        if c:
            d = cat_bytes.setdefault(k, {})
            d[c] = d.get(c, 0) + b
    order = sorted(
        (k for k in range(len(sites)) if count[k]), key=lambda k: (-per[k], sites[k].label)
    )
    out = []
    for k in order[:limit]:
        cats = cat_bytes.get(k, {})
        main = min(cats, key=lambda c: (-cats[c], c)) if cats else ""
        out.append(
            SiteBytes(
                site=sites[k],
                bytes=int(per[k]),
                blocks=int(count[k]),
                share=float(per[k]) / total if total else 0.0,
                largest_block_bytes=int(largest[k]),
                category=main,
            )
        )
    return tuple(out)

"""The allocator's segments at dump time: reserved vs allocated bytes, free pieces,
fragmentation."""

from __future__ import annotations

from gpuprof_nb.model.memory import MemorySnapshot
from gpuprof_nb.results.memory import SegmentRow, SegmentSummary


def segment_summary(snapshot: MemorySnapshot, device: int) -> SegmentSummary:
    """Return reserved vs allocated bytes, free pieces and fragmentation at dump time."""
    segs = snapshot.segments_of(device)
    free_sizes = [b.size for s in segs for b in s.blocks if not b.is_active]
    free = sum(free_sizes)
    largest_free = max(free_sizes, default=0)
    rows = sorted(
        (
            SegmentRow(
                address=s.address,
                segment_type=s.segment_type,
                total_bytes=s.total_size,
                active_bytes=s.active_size,
                largest_free_bytes=max((b.size for b in s.blocks if not b.is_active), default=0),
            )
            for s in segs
        ),
        key=lambda r: (-r.total_bytes, r.address),
    )
    return SegmentSummary(
        device=device,
        n_segments=len(segs),
        reserved_bytes=sum(s.total_size for s in segs),
        allocated_bytes=sum(s.allocated_size for s in segs),
        active_bytes=sum(s.active_size for s in segs),
        free_bytes=free,
        largest_free_block_bytes=largest_free,
        n_free_blocks=len(free_sizes),
        fragmentation_ratio=1.0 - largest_free / free if free else 0.0,
        largest_segments=tuple(rows[:20]),
    )

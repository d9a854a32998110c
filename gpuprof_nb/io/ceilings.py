"""The ceilings `measure_ceilings()` measured, cached per device in
~/.cache/gpuprof_nb/ceilings.json (GPUPROF_NB_CACHE_DIR overrides the folder), and the
ceilings an offline trace is drawn against: measured ones cached for its GPU, else the
datasheet row. A measured spec read from the cache says where it came from in its `source`,
so the roofline built on it says so too."""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path
from typing import Any

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.guards import loads_json, open_regular
from gpuprof_nb.model.device import DeviceSpec, lookup_device_spec
from gpuprof_nb.model.trace import Trace

CACHE_ENV = "GPUPROF_NB_CACHE_DIR"
_CACHE_FILE = "ceilings.json"
_CACHE_VERSION = 1
# A cache holds a few hundred bytes per device measured.
_MAX_CACHE_BYTES = 16 << 20


def cache_path() -> Path:
    """Return the ceilings cache file: $GPUPROF_NB_CACHE_DIR/ceilings.json, else
    ~/.cache/gpuprof_nb/ceilings.json."""
    folder = os.environ.get(CACHE_ENV)
    base = Path(folder) if folder else Path.home() / ".cache" / "gpuprof_nb"
    return base / _CACHE_FILE


def device_key(kind: str, name: str, memory_bytes: int | None) -> str:
    """Return the cache key of a device: kind, name and memory size (or CPU threads)."""
    return f"{kind}|{name}|{memory_bytes if memory_bytes is not None else ''}"


def _read_cache() -> dict[str, Any]:
    path = cache_path()
    if not path.exists():
        return {}
    try:
        f, st = open_regular(path, what="the ceilings cache", error=GpuprofError)
        with f:
            if st.st_size > _MAX_CACHE_BYTES:
                raise GpuprofError(f"{path}: {st.st_size:,} bytes, far more than a cache holds")
            data = loads_json(f.read(), str(path), GpuprofError)
    except (GpuprofError, OSError) as exc:
        warnings.warn(
            f"{path}: unreadable ceilings cache ({exc}); ignoring it (delete it, "
            "or run gpuprof_nb.measure_ceilings() to rewrite it)",
            stacklevel=3,
        )
        return {}
    devices = data.get("devices") if isinstance(data, dict) else None
    return devices if isinstance(devices, dict) else {}


def write_ceilings(key: str, spec: DeviceSpec) -> None:
    """Store `spec` under `key` (see device_key) in the cache, keeping the other devices."""
    path = cache_path()
    devices = _read_cache()
    devices[key] = spec.as_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(
        json.dumps({"version": _CACHE_VERSION, "devices": devices}, indent=1, sort_keys=True),
        encoding="utf-8",
    )
    tmp.replace(path)  # atomic: a concurrent reader never sees half a file


def cached_ceilings(kind: str, name: str, memory_bytes: int | None) -> DeviceSpec | None:
    """Return the measured ceilings cached for this device, None when none were measured.
    Their `source` ends with the cache file they were read from."""
    path = cache_path()
    entry = _read_cache().get(device_key(kind, name, memory_bytes))
    if entry is None:
        return None
    try:
        spec = DeviceSpec.from_dict(entry, where=f"{path} [{name}]")
    except GpuprofError as exc:
        warnings.warn(str(exc), stacklevel=2)
        return None
    return dataclasses.replace(spec, source=f"{spec.source}; read from {path}")


def trace_ceilings(trace: Trace) -> DeviceSpec | None:
    """Return the ceilings a GPU trace is drawn against when none are given: measured ones
    cached for its device (name and memory from deviceProperties), else the datasheet row;
    None for a CPU trace (its machine's ceilings are not known offline) or an unknown GPU.
    The session reads this and hands it to the analysis, which reads no cache."""
    info = trace.recorded_gpu
    if info is None:
        return None
    measured = cached_ceilings("cuda", info.name, info.total_memory_bytes)
    return measured or lookup_device_spec(info.name, info.total_memory_bytes)

"""How torch.profiler names a Python call: a `python_function` event's name is
`path/file.py(123): function` (the line where the function starts), a built-in call
`<built-in method ...>`. The capture reads it to cut its own calls out of a trace and to
rebuild CPU stacks; the analysis reads it to name lines (analysis/sources.py).

Also whose code a frame runs (`frame_kind`: the user's, torch's, another package's, the
standard library's) and whether a file is a notebook cell's: the capture's line tracer
keeps the user's frames only, and the analysis groups frames by it."""

from __future__ import annotations

import functools
import re
import sys
import sysconfig
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class Frame:
    """One stack frame: the file, the line running in it (the line a function starts at,
    for frames rebuilt from profiler events), the function and, when known, that line's
    text. The line sampler's stacks (model/samples.py) and the allocator's (model/memory.py:
    Python, TorchScript or C++ frames) are made of these."""

    file: str
    line: int
    function: str
    text: str = ""


_PROFILER_FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")


def profiler_frame_parts(name: str) -> tuple[str, int, str] | None:
    """Return (file, line, function) of a python_function event name, or None for a
    built-in call (`<built-in method ...>`)."""
    m = _PROFILER_FRAME.match(name)
    return (m.group(1), int(m.group(2)), m.group(3)) if m else None


def profiler_frame_file(name: str) -> str | None:
    """Return the file of a python_function event name, or None for a built-in call."""
    parts = profiler_frame_parts(name)
    return parts[0] if parts else None


# Whose code a frame runs: the user's (notebook cells, their own files), torch's, another
# installed package's, or the standard library's.
FrameKind = Literal["user", "torch", "library", "stdlib"]

# IPython's own cell names: <ipython-input-12-0a1b2c3d>, the execution number inside.
IPYTHON_INPUT = re.compile(r"^<ipython-input-(\d+)-[0-9a-f]+>$")
# ipykernel's: <tmp>/ipykernel_<pid>/<hash>.py (no number inside).
_IPYKERNEL_CELL = re.compile(r"(?:^|[\\/])ipykernel_\d+[\\/](\d+)\.py$")


@functools.lru_cache(maxsize=4096)
def is_cell_file(filename: str) -> bool:
    """Whether `filename` is a notebook cell's (IPython or ipykernel), numbered or not."""
    return bool(IPYTHON_INPUT.match(filename) or _IPYKERNEL_CELL.search(filename))


_STDLIB = re.compile(r"[\\/]lib[\\/]python\d+(?:\.\d+)?[\\/]|[\\/]Lib[\\/]")
_LIBRARY = re.compile(r"[\\/](?:site|dist)-packages[\\/]")
_TORCH = re.compile(r"(?:^|[\\/])(?:torch|torchvision|torchaudio|triton)[\\/]")
_STDLIB_DIR = sysconfig.get_paths().get("stdlib", "").replace("\\", "/")
# Packages whose shortened paths (see frame_kind) are library code, not the user's.
KNOWN_PACKAGES = frozenset(
    {
        "accelerate",
        "apex",
        "datasets",
        "deepspeed",
        "einops",
        "fairscale",
        "flash_attn",
        "gpuprof_nb",
        "IPython",
        "ipykernel",
        "lightning",
        "megatron",
        "numpy",
        "pandas",
        "PIL",
        "pytorch_lightning",
        "safetensors",
        "scipy",
        "sklearn",
        "timm",
        "tokenizers",
        "tqdm",
        "transformers",
        "xformers",
        "functorch",
        "torchtext",
        "torchdata",
        "tornado",
        "zmq",
        "traitlets",
        "jupyter_client",
        "debugpy",
        "peft",
        "diffusers",
        "wandb",
        "tensorboard",
    }
)


def frame_kind(file: str) -> FrameKind:
    """Return whose code a frame of `file` runs (see FrameKind). The profiler shortens the
    paths it records to the part below the sys.path entry they were found in (`inspect.py`,
    `json/encoder.py`, `torch/nn/modules/module.py`, `train.py`), so a relative path is
    judged by its top-level module: the standard library's, torch's, another well-known
    package's, else the user's."""
    if is_cell_file(file):
        return "user"
    path = file.replace("\\", "/")
    if not path or path.startswith("<"):
        return "library"  # built-ins, <frozen ...>, generated code
    if _TORCH.search(path):
        return "torch"
    if _LIBRARY.search(path) or "/gpuprof_nb/" in path:
        return "library"
    if _STDLIB.search(path) or (_STDLIB_DIR and path.startswith(_STDLIB_DIR + "/")):
        return "stdlib"
    if not path.startswith("/") and path[1:3] != ":/":
        top = path.split("/", 1)[0].removesuffix(".py")
        if top in sys.stdlib_module_names:
            return "stdlib"
        if top in KNOWN_PACKAGES:
            return "library"
    return "user"

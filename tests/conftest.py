"""Suite-wide settings: quiet Kineto, headless matplotlib, and the `gpu` marker."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
os.environ.setdefault("MPLBACKEND", "Agg")
# The tests never read or write the user's ceilings cache (~/.cache/gpuprof_nb): a machine
# that measured its ceilings once (a GPU machine running tools/gpu_modules_check.py) would
# otherwise put measured peaks into reports the tests expect from the datasheet. Tests of the
# cache point this variable at their own folders.
os.environ["GPUPROF_NB_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpuprof_test_cache_")

import pytest  # noqa: E402

DATA = Path(__file__).parent / "data"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cpu_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The magics take their CPU path even where torch sees a GPU: for tests about that
    path (wall-clock timing a fake clock can drive, the CPU memory fallback that records
    CPU tensors). Patches the hook the capture code asks, not torch.cuda.is_available:
    its answer is cached per process, and torch itself keeps seeing the GPU. A hook
    renamed in the product fails here (monkeypatch raises) instead of silently not
    applying. The ladder needs none of this: its tests pass device="cpu"."""
    from gpuprof_nb.capture import device

    monkeypatch.setattr(device, "cuda_available", lambda: False)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def ipython_shell():
    """The one in-process IPython shell of the test session. `start_ipython()` builds it once
    and returns None on later calls, so every magic test module must share it through here."""
    from IPython.testing import globalipapp

    shell = globalipapp.start_ipython() or globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "gpuprof_nb")
    return shell


@pytest.fixture
def live_display(monkeypatch: pytest.MonkeyPatch):
    """A live kernel as the progress bar sees it: `display` records what is shown
    (`.shown`) and what its handle is updated with (`.updates`)."""
    from types import SimpleNamespace

    import IPython.display

    from gpuprof_nb.render import progress

    seen = SimpleNamespace(shown=[], updates=[])

    class Handle:
        def update(self, obj: object) -> None:
            seen.updates.append(obj)

    def fake_display(obj: object, display_id: object = None) -> Handle:
        seen.shown.append(obj)
        return Handle()

    monkeypatch.setattr(progress, "live_kernel", lambda: True)
    monkeypatch.setattr(IPython.display, "display", fake_display)
    return seen


@pytest.fixture
def one_torch_thread():
    """One intra-op torch thread for the test: a small op gains nothing from more, and on a
    loaded 2-core runner OpenMP threads waiting for each other can make it take milliseconds
    (and spin through a sleep), which swamps what the test plants."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

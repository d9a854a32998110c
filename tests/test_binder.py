"""The tutorials run where users open them: Binder (binder/, as repo2docker installs it) and
Colab (each tutorial's first cell installs gpuprof_nb there and does nothing elsewhere).

The Binder test builds a FRESH virtual environment, runs repo2docker's own command
(`pip install --no-cache-dir -r binder/requirements.txt` from a copy of the repository), and
executes every tutorial in it with nbclient. The file is used exactly as written; pip runs
with a 20 s timeout and no retries, so an unreachable PyTorch index costs seconds, not a hang,
and pip then takes the same torch==X+cpu wheel from its local config (find-links) where there
is one. GPUPROF_BINDER_OFFLINE=1 drops the PyTorch index line altogether. Either way the test
fails if a CUDA build (nvidia-* wheels) got in.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BINDER = REPO / "binder"
TUTORIALS = sorted((REPO / "tutorials").glob("*.ipynb"))
PYTORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def _makefile_torch_version() -> str:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^TORCH_VERSION\s*\?=\s*(\S+)", text, re.M)
    assert match, "Makefile has no `TORCH_VERSION ?= ...` line"
    return match.group(1)


def _requirement_lines() -> list[str]:
    lines = (BINDER / "requirements.txt").read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


# -- binder/ as repo2docker reads it -----------------------------------------------------------


def test_binder_pins_the_cpu_torch_of_the_makefile() -> None:
    lines = _requirement_lines()
    torch_pins = [ln for ln in lines if re.match(r"torch\b", ln)]
    assert torch_pins == [f"torch=={_makefile_torch_version()}+cpu"], torch_pins
    assert f"--extra-index-url {PYTORCH_INDEX}" in lines
    # The package itself, resolved against the repository root (repo2docker's working dir).
    assert {".", "-e .", ".[distributed]", "-e .[distributed]"} & set(lines)
    assert any(re.match(r"jupyterlab\b", ln) for ln in lines)
    assert any(re.match(r"ipywidgets\b", ln) for ln in lines)
    runtime = (BINDER / "runtime.txt").read_text(encoding="utf-8").strip()
    assert re.fullmatch(r"python-3\.\d+", runtime), runtime


# -- Colab: the first cell -------------------------------------------------------------------


def _first_code_cell(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert cells, f"{path.name} has no code cell"
    src = cells[0]["source"]
    return "".join(src) if isinstance(src, list) else src


class _FakeShell:
    """Records the magics the cell asks for instead of running pip."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def run_line_magic(self, name: str, line: str) -> None:
        self.calls.append((name, line))

    def system(self, cmd: str) -> None:
        self.calls.append(("!", cmd))


def _run_first_cell(path: Path) -> tuple[list[tuple[str, str]], set[str]]:
    from IPython.core.inputtransformer2 import TransformerManager

    code = TransformerManager().transform_cell(_first_code_cell(path))
    shell = _FakeShell()
    namespace: dict[str, object] = {"get_ipython": lambda: shell}
    exec(compile(code, f"{path.name}[first cell]", "exec"), namespace)
    names = {k for k in namespace if not k.startswith("__") and k != "get_ipython"}
    return shell.calls, names


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.name for p in TUTORIALS])
def test_first_cell_installs_gpuprof_nb_only_in_colab(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    calls, names = _run_first_cell(path)
    assert calls == [], f"{path.name}: first cell runs {calls} outside Colab"
    assert names <= {"sys", "os", "subprocess", "importlib"}, names

    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    calls, _ = _run_first_cell(path)
    installs = [c for c in calls if "install" in c[1] and "gpuprof_nb" in c[1]]
    assert len(installs) == 1 and installs[0][0] in ("pip", "!"), (
        f"{path.name}: in Colab the first cell should pip-install gpuprof_nb once, ran {calls}"
    )


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.name for p in TUTORIALS])
def test_tutorial_is_stored_without_outputs(path: Path) -> None:
    nb = json.loads(path.read_text(encoding="utf-8"))
    dirty = [
        i for i, c in enumerate(nb["cells"])
        if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))
    ]  # fmt: skip
    assert not dirty, f"{path.name}: code cells {dirty} carry outputs or execution counts"
    assert "widgets" not in nb.get("metadata", {}), f"{path.name}: saved widget state"


def test_there_are_tutorials() -> None:
    assert len(TUTORIALS) >= 1


# -- Binder: a fresh environment, installed as repo2docker does ---------------------------------

_RUNNER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import nbformat
    from nbclient import NotebookClient
    failed = []
    for path in map(Path, sys.argv[1:]):
        nb = nbformat.read(path, as_version=4)
        start = time.monotonic()
        try:
            NotebookClient(nb, timeout=300, kernel_name="python3",
                           resources={"metadata": {"path": str(path.parent)}}).execute()
            print(f"ok {path.name} {time.monotonic() - start:.1f} s", flush=True)
        except Exception as exc:
            failed.append(path.name)
            print(f"FAILED {path.name}: {type(exc).__name__}: {str(exc)[-3000:]}", flush=True)
    sys.exit(1 if failed else 0)
    """
)


def _copy_repo(dest: Path) -> None:
    """Copy what repo2docker would see: the checkout's files (tracked and new, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


@pytest.mark.slow
def test_binder_environment_runs_the_tutorials(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is needed to list the repository's files")
    repo = tmp_path / "repo"
    _copy_repo(repo)
    if os.environ.get("GPUPROF_BINDER_OFFLINE") == "1":
        reqs = repo / "binder" / "requirements.txt"
        kept = [
            ln for ln in reqs.read_text(encoding="utf-8").splitlines()
            if PYTORCH_INDEX not in ln
        ]  # fmt: skip
        reqs.write_text("\n".join(kept) + "\n", encoding="utf-8")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    env = dict(os.environ)
    for key in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(key, None)
    env.update(
        PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1", KINETO_LOG_LEVEL="6",
        MPLBACKEND="Agg", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        JUPYTER_PLATFORM_DIRS="1", JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
        JUPYTER_DATA_DIR=str(tmp_path / "jupyter-data"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "jupyter-runtime"),
    )  # fmt: skip
    start = time.monotonic()
    install = subprocess.run(
        [str(py), "-m", "pip", "install", "--no-cache-dir", "--quiet",
         "--timeout", "20", "--retries", "0", "-r", "binder/requirements.txt"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=420,
    )  # fmt: skip
    install_s = time.monotonic() - start
    assert install.returncode == 0, f"pip install failed:\n{install.stderr[-4000:]}"

    freeze = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=json"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    versions = {p["name"].lower(): p["version"] for p in json.loads(freeze)}
    assert versions.get("torch") == f"{_makefile_torch_version()}+cpu", versions.get("torch")
    assert not [n for n in versions if n.startswith("nvidia-")], "CUDA wheels were installed"
    assert "gpuprof-nb" in versions or "gpuprof_nb" in versions

    # The package comes from the copy, not from this checkout.
    where = subprocess.run(
        [str(py), "-c", "import gpuprof_nb; print(gpuprof_nb.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert str(REPO) not in where, where

    notebooks = [str(repo / "tutorials" / p.name) for p in TUTORIALS]
    run = subprocess.run(
        [str(py), "-c", _RUNNER, *notebooks],
        cwd=repo, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    report = f"install {install_s:.0f} s\n{run.stdout}\n{run.stderr[-3000:]}"
    print(report)
    assert run.returncode == 0, report

"""Comparison 5: how many bytes one %%gpuprofile and one %%memsnap output add to a .ipynb.

A small notebook is executed with nbclient in a real kernel (as `jupyter nbconvert
--execute` would). A cell's weight is what saving it adds to the file: the notebook's
size minus its size with that cell's outputs cleared, plus the saved widget state of the
widgets its outputs show (nbclient stores widget state in the notebook metadata, as
JupyterLab does with "Save widget state automatically").
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from benchmarks.config import BenchConfig, Section, Target

LIMIT_BYTES = 300 * 1024

CELLS = [
    "import os\nos.environ['KINETO_LOG_LEVEL'] = '6'\nos.environ['MPLBACKEND'] = 'Agg'",
    "%load_ext gpuprof_nb",
    "import torch\ntorch.manual_seed(0)\n"
    "model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),\n"
    "                            torch.nn.Linear(512, 10))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
    "x, target = torch.randn(64, 256), torch.randint(0, 10, (64,))",
    "%%gpuprofile\n"
    "for _ in range(3):\n"
    "    loss = torch.nn.functional.cross_entropy(model(x), target)\n"
    "    opt.zero_grad(); loss.backward(); opt.step()",
    "%%memsnap\n"
    "kept = []\n"
    "for _ in range(3):\n"
    "    loss = torch.nn.functional.cross_entropy(model(x), target)\n"
    "    loss.backward()\n"
    "    kept.append(loss)",
]
MEASURED = {3: "%%gpuprofile", 4: "%%memsnap"}
_MODEL_REF = re.compile(r"IPY_MODEL_([0-9a-f]+)")


def execute_notebook(timeout_s: int = 600) -> Any:
    """Build and execute the notebook; return the executed NotebookNode."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    NotebookClient(nb, timeout=timeout_s, kernel_name="python3", store_widget_state=True).execute()
    return nb


def _size(nb: Any) -> int:
    import nbformat

    return len(nbformat.writes(nb).encode("utf-8"))


def widget_models(nb: Any, cell: Any) -> set[str]:
    """Model ids of the widgets the cell's outputs show, and every model they reference."""
    state = (
        nb.metadata.get("widgets", {})
        .get("application/vnd.jupyter.widget-state+json", {})
        .get("state", {})
    )
    todo = [
        out["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
        for out in cell.outputs
        if "application/vnd.jupyter.widget-view+json" in out.get("data", {})
    ]
    seen: set[str] = set()
    while todo:
        mid = todo.pop()
        if mid in seen or mid not in state:
            continue
        seen.add(mid)
        todo.extend(_MODEL_REF.findall(json.dumps(state[mid])))
    return seen


def cell_weight(nb: Any, index: int) -> dict[str, int]:
    """Bytes the cell's outputs add: in the cell itself and in saved widget state."""
    cleared = copy.deepcopy(nb)
    cleared.cells[index].outputs = []
    cleared.cells[index].execution_count = None
    in_cell = _size(nb) - _size(cleared)
    state = (
        nb.metadata.get("widgets", {})
        .get("application/vnd.jupyter.widget-state+json", {})
        .get("state", {})
    )
    models = widget_models(nb, nb.cells[index])
    in_state = sum(len(json.dumps({m: state[m]}, indent=1)) for m in models)
    mimes: dict[str, int] = {}
    for out in nb.cells[index].outputs:
        for mime, value in out.get("data", {}).items():
            mimes[mime] = mimes.get(mime, 0) + len(json.dumps(value))
    return {
        "in_cell": in_cell,
        "widget_state": in_state,
        "total": in_cell + in_state,
        **{f"mime:{k}": v for k, v in mimes.items()},
    }


def run(cfg: BenchConfig) -> Section:
    nb = execute_notebook()
    lines = [
        "A 5-cell notebook (a small MLP training step) executed with nbclient; bytes a cell's "
        "output adds to the saved `.ipynb` (outputs + saved widget state).",
        "",
        "| cell | in the cell | widget state | total | largest parts |",
        "|---|---|---|---|---|",
    ]
    targets: list[Target] = []
    for index, label in MEASURED.items():
        w = cell_weight(nb, index)
        parts = sorted(
            ((k[5:], v) for k, v in w.items() if k.startswith("mime:")), key=lambda kv: -kv[1]
        )
        part_text = ", ".join(f"{k} {v / 1024:.1f} KB" for k, v in parts[:3]) or "-"
        errors = [o for o in nb.cells[index].outputs if o.get("output_type") == "error"]
        if errors:
            part_text = f"cell raised {errors[0].get('ename')}: {errors[0].get('evalue')}"[:200]
        lines.append(
            f"| `{label}` | {w['in_cell'] / 1024:.1f} KB "
            f"| {w['widget_state'] / 1024:.1f} KB | {w['total'] / 1024:.1f} KB "
            f"| {part_text} |"
        )
        targets.append(
            Target(
                f"`{label}` output size",
                f"{w['total'] / 1024:.1f} KB",
                "< 300 KB",
                (w["total"] < LIMIT_BYTES) if not errors else False,
            )
        )
    return Section("5. Notebook weight", "\n".join(lines), tuple(targets))

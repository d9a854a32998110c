"""The rules package (analysis/rules/): RULES lists the rules in the order diagnose runs
them (findings with equal sort keys keep that order), and the names other modules import
from the package stay there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import gpuprof_nb.analysis.diagnose as diagnose_module
from gpuprof_nb.analysis import rules
from gpuprof_nb.io.trace import load_trace

DATA = Path(__file__).parents[1] / "data"
BERT = DATA / "h100_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz"


def test_diagnose_runs_the_rules_in_the_order_of_RULES(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[str] = []
    for rule in rules.RULES:

        def recorded(*args: Any, _rule: Any = rule, **kwargs: Any) -> Any:
            called.append(_rule.__name__)
            return _rule(*args, **kwargs)

        monkeypatch.setattr(diagnose_module, rule.__name__, recorded)
    # A GPU trace with kernels: every rule runs (some only on the device).
    diagnose_module.diagnose(load_trace(BERT))
    assert called == [rule.__name__ for rule in rules.RULES]


def test_the_package_keeps_the_names_imported_from_it() -> None:
    for name in rules.__all__:
        assert getattr(rules, name) is not None, name
    # Each rule lives in the module of its family.
    assert rules.rule_dataloader.__module__ == "gpuprof_nb.analysis.rules.input_pipeline"
    assert rules.rule_memory_growth.__module__ == "gpuprof_nb.analysis.rules.memory_growth"
    assert rules.Context.__module__ == "gpuprof_nb.analysis.rules.context"

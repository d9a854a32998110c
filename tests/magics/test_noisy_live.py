"""A real `%%gpuprofile` run whose timed samples spread widely: the Diagnosis says so first,
and the headline with it (issue 32: a run spread 7.88x was headlined "healthy")."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.usefixtures("cpu_path")


def test_a_run_that_spreads_widely_leads_with_noisy_measurement(ipython_shell) -> None:
    ip = ipython_shell
    ip.run_cell("import time, torch\n_noisy_k = 0")
    # Every other run sleeps 10x longer: the samples spread several times.
    ip.run_cell_magic(
        "gpuprofile",
        "-o r --quiet --warmup 0 --repeat 6 --number 1",
        "_noisy_k += 1\nx = torch.ones(4) + 1\ntime.sleep(0.05 if _noisy_k % 2 else 0.005)\n",
    )
    r = ip.user_ns["r"]
    assert r.timing.noisy
    first = r.diagnosis.findings[0]
    assert first.kind == "noisy_measurement"
    assert first.evidence["sample_spread_ratio"] > 3
    assert r.diagnosis.verdict.startswith("Noisy measurement: the 6 timed samples spread")
    assert "--repeat" in first.fix
    first_listed = next(line for line in r.text().splitlines() if line.startswith("1. ["))
    assert first_listed.endswith("(noisy_measurement)"), first_listed

"""The hostile-input harness: cases run in one child process per test, under a memory limit
(RLIMIT_AS, set after the imports) and a time limit, so an input that crashes the
interpreter, hangs or eats all memory fails its test naming the case instead of taking the
test run down. Only the outcome class is checked, never speed:

- "own": the library's own error (GpuprofError, or IPython's UsageError for a magic);
- "ok": a result, rendered to its mimebundle, which must encode as JSON (what Jupyter sends);
- "raw": any other exception (a bug), "crash" (the child died), "hang" (time ran out),
  "memory" (MemoryError: the limit was hit).

A case is (name, code, expect): `code` runs with `exec`; it sets `result` (shown, then
checked by an optional `check` expression) or raises. `expect` is "refuse" (must be "own"),
"accept" (must be "ok") or "either".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

_CHILD = r"""
import gc, json, os, resource, sys, time, traceback
sys.setrecursionlimit(3000)
out = open(sys.argv[1], "w", buffering=1)
cases = json.loads(open(sys.argv[2]).read())
budget = int(sys.argv[3])
import gpuprof_nb
from gpuprof_nb import GpuprofError
try:
    from IPython.core.error import UsageError
except ImportError:
    UsageError = GpuprofError
PRELUDE = sys.argv[4]
ns0 = {}
exec(PRELUDE, ns0)
def vm_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
if budget and os.path.exists("/proc/self/statm"):
    limit = vm_bytes() + budget
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
for case in cases:
    out.write(json.dumps({"case": case["name"], "started": True}) + "\n")
    ns = dict(ns0)
    t = time.perf_counter()
    row = {"case": case["name"]}
    try:
        exec(case["code"], ns)
        result = ns.get("result")
        if hasattr(result, "_repr_mimebundle_"):
            bundle = result._repr_mimebundle_()
            json.dumps(bundle)
            row["html_chars"] = len(bundle.get("text/html", ""))
            row["text_chars"] = len(bundle.get("text/plain", ""))
        if case.get("check"):
            ns["result"] = result
            if not eval(case["check"], ns):
                raise AssertionError("check failed: " + case["check"])
        row["outcome"] = "ok"
    except (GpuprofError, UsageError) as exc:
        row["outcome"] = "own"
        row["type"] = type(exc).__name__
        row["message"] = str(exc)[:2000]
    except MemoryError:
        row["outcome"] = "memory"
    except AssertionError as exc:
        row["outcome"] = "wrong"
        row["message"] = str(exc)[:2000]
    except BaseException as exc:
        row["outcome"] = "raw"
        row["type"] = type(exc).__name__
        row["message"] = (str(exc)[:500] + "\n" + traceback.format_exc()[-3000:])
    row["seconds"] = round(time.perf_counter() - t, 3)
    row["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    out.write(json.dumps(row) + "\n")
    del ns
    gc.collect()
"""


@dataclass
class Case:
    name: str
    code: str
    expect: str = "either"  # "refuse", "accept" or "either"
    check: str | None = None
    words: str | None = None  # with "refuse": text the message must contain


def run_cases(
    cases: list[Case],
    tmp_path: Path,
    *,
    prelude: str = "",
    memory_mb: int = 1500,
    seconds: float = 240,
) -> dict[str, dict[str, Any]]:
    """Run the cases in one child process (see the module docstring); return each case's
    row. Cases after a crash or hang are run again in a fresh child."""
    rows: dict[str, dict[str, Any]] = {}
    todo = list(cases)
    while todo:
        spec = tmp_path / "cases.json"
        spec.write_text(
            json.dumps(
                [{"name": c.name, "code": textwrap.dedent(c.code), "check": c.check} for c in todo]
            )
        )
        log = tmp_path / "outcomes.jsonl"
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        env.setdefault("OMP_NUM_THREADS", "1")
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CHILD,
                str(log),
                str(spec),
                str(memory_mb << 20),
                textwrap.dedent(prelude),
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            _, err = child.communicate(timeout=seconds)
            ended = "crash" if child.returncode else None
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            _, err = child.communicate()
            ended = "hang"
        started = None
        if log.exists():
            for line in log.read_text().splitlines():
                row = json.loads(line)
                if row.get("started"):
                    started = row["case"]
                else:
                    rows[row["case"]] = row
                    started = None
        if started is not None:
            rows[started] = {
                "case": started,
                "outcome": ended or "crash",
                "message": (err or b"").decode(errors="replace")[-2000:],
            }
        elif ended is not None and not rows:
            raise AssertionError(f"the harness child failed: {(err or b'').decode()[-3000:]}")
        todo = [c for c in todo if c.name not in rows]
        if started is None and todo and ended is None:
            raise AssertionError(f"cases never ran: {[c.name for c in todo]}")
    return rows


def judge(cases: list[Case], rows: dict[str, dict[str, Any]]) -> None:
    """Fail listing every case whose outcome is not what it expects."""
    bad = []
    for c in cases:
        row = rows[c.name]
        outcome = row["outcome"]
        allowed = {"refuse": {"own"}, "accept": {"ok"}, "either": {"own", "ok"}}[c.expect]
        if outcome not in allowed:
            bad.append(f"{c.name}: {outcome} (expected {c.expect}): {row.get('message', '')}")
        elif outcome == "own" and c.words and c.words not in row.get("message", ""):
            bad.append(f"{c.name}: message lacks {c.words!r}: {row.get('message')}")
    assert not bad, "\n".join(bad)

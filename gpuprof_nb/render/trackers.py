"""A result's headline scalars (render/records.py) sent to an experiment tracker:
`report.log_to(run)` for Weights & Biases and MLflow, `report.to_tensorboard(writer)` for
TensorBoard. Nothing here imports a tracker at module level: W&B needs none (its run logs
itself), MLflow's client is imported only when an MLflow run is given, and the TensorBoard
writer is the caller's own (torch.utils.tensorboard or tensorboardX)."""

from __future__ import annotations

import time
import types
from typing import Any

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.render.records import headline

DEFAULT_PREFIX = "gpuprof/"


def _named(obj: object, prefix: str) -> dict[str, float]:
    if not isinstance(prefix, str):
        raise GpuprofError(f"prefix must be a string, got {type(prefix).__name__}")
    return {f"{prefix}{k}": v for k, v in headline(obj).items()}


def _check_step(step: object) -> int | None:
    if step is None:
        return None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise GpuprofError(f"step must be a whole number of 0 or more, got {step!r}")
    return step


def _module_of(run: object) -> str:
    if isinstance(run, types.ModuleType):
        return run.__name__
    return type(run).__module__ or ""


def log_to(
    obj: object, run: Any, *, prefix: str = DEFAULT_PREFIX, step: int | None = None
) -> dict[str, float]:
    """Log a result's headline scalars to `run` and return what was logged (name -> value).

    `run`: a W&B run (`wandb.init(...)`), an MLflow run (`mlflow.start_run()`) or the
    `mlflow` module itself (its active run), or anything with `log_metrics(dict, step=)` or
    `log(dict)`. Names are `prefix` + the headline's names, units in them
    (`gpuprof/step_time_us`); `step` is the tracker's step (None: W&B's own counter, 0 for
    MLflow)."""
    metrics = _named(obj, prefix)
    step = _check_step(step)
    module = _module_of(run)
    if module.startswith("wandb"):
        if step is None:
            run.log(metrics)
        else:
            run.log(metrics, step=step)
    elif module == "mlflow" and isinstance(run, types.ModuleType):
        run.log_metrics(metrics, step=step)
    elif module.startswith("mlflow") and hasattr(run, "info"):
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        stamp = int(time.time() * 1000)
        MlflowClient().log_batch(
            run.info.run_id,
            metrics=[Metric(k, v, stamp, step or 0) for k, v in metrics.items()],
        )
    elif callable(getattr(run, "log_metrics", None)):
        run.log_metrics(metrics, step=step)
    elif callable(getattr(run, "log", None)):
        run.log(metrics)
    else:
        raise GpuprofError(
            f"log_to: a {type(run).__name__} is not a tracker run; pass a W&B run "
            "(wandb.init()), an MLflow run (mlflow.start_run()) or the mlflow module"
        )
    return metrics


def to_tensorboard(
    obj: object, writer: Any, *, prefix: str = DEFAULT_PREFIX, step: int = 0
) -> dict[str, float]:
    """Write a result's headline scalars to a TensorBoard SummaryWriter (torch's or
    tensorboardX's: anything with `add_scalar(tag, value, global_step)`) at `step`, flush
    it, and return what was written (tag -> value)."""
    checked = _check_step(step)
    if not callable(getattr(writer, "add_scalar", None)):
        raise GpuprofError(
            f"to_tensorboard: a {type(writer).__name__} has no add_scalar; pass a "
            "torch.utils.tensorboard.SummaryWriter"
        )
    metrics = _named(obj, prefix)
    for tag, value in metrics.items():
        writer.add_scalar(tag, value, global_step=checked or 0)
    flush = getattr(writer, "flush", None)
    if callable(flush):
        flush()
    return metrics

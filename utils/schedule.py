"""Learning-rate schedules: when they step."""

from typing import Any

import torch


def step_scheduler(
    scheduler: Any, metrics: dict[str, float], monitor_key: str, per_batch: bool
) -> None:
    """Step an epoch-interval learning-rate schedule after an epoch (per-step ones step in the
    loop). ReduceLROnPlateau is given the monitored value; without a monitor it watches val/loss,
    or train/loss when there is no validation data."""
    if scheduler is None or per_batch:
        return
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        key = monitor_key or ("val/loss" if "val/loss" in metrics else "train/loss")
        scheduler.step(metrics[key])
    else:
        scheduler.step()

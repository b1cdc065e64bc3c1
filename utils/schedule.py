"""Learning-rate schedules: built from config with their length derived from the run, a linear
warmup in front, and when they step."""

from typing import TYPE_CHECKING, Any

import torch
from torch.optim import lr_scheduler as schedulers

from utils.util import UserError

if TYPE_CHECKING:
    from parse_config import ConfigParser

# The argument that sets a schedule's whole length, derived from the run when the config leaves
# it out: then --epochs rescales the schedule instead of leaving a longer one half done.
LENGTH_ARGS = {
    "CosineAnnealingLR": "T_max",
    "OneCycleLR": "total_steps",
    "PolynomialLR": "total_iters",
}


def schedule_length(config: "ConfigParser", steps_per_epoch: int) -> tuple[int, int]:
    """(whole run, warmup) in the schedule's own unit: optimizer steps for a per-step schedule,
    epochs for a per-epoch one."""
    section, epochs = config["lr_scheduler"], config["trainer"]["epochs"]
    if section["interval"] == "epoch":
        return epochs, int(section["warmup_epochs"])
    warmup = section["warmup_steps"] or round(section["warmup_epochs"] * steps_per_epoch)
    return epochs * steps_per_epoch, warmup


def build_scheduler(
    config: "ConfigParser", optimizer: torch.optim.Optimizer, steps_per_epoch: int
) -> Any:
    """lr_scheduler.type from torch.optim.lr_scheduler, after warmup_epochs/warmup_steps of
    LinearLR from warmup_start_factor x lr (SequentialLR chains them), or None."""
    section = config["lr_scheduler"]
    if section is None:
        return None
    length, warmup = schedule_length(config, steps_per_epoch)
    derived = {}
    length_arg = LENGTH_ARGS.get(section["type"])
    # OneCycleLR also takes its length as epochs x steps_per_epoch.
    if length_arg and length_arg not in section["args"] and "epochs" not in section["args"]:
        if length - warmup < 1:
            unit = "epochs" if section["interval"] == "epoch" else "optimizer steps"
            raise UserError(
                f"{config.source}: lr_scheduler: the warmup ({warmup} {unit}) leaves nothing of "
                f"the run ({length} {unit}) for {section['type']}; shorten the warmup"
            )
        derived[length_arg] = length - warmup
    main = config.init_obj("lr_scheduler", schedulers, optimizer, **derived)
    if warmup == 0:
        return main
    start = schedulers.LinearLR(
        optimizer, start_factor=section["warmup_start_factor"], total_iters=warmup
    )
    return schedulers.SequentialLR(optimizer, [start, main], milestones=[warmup])


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

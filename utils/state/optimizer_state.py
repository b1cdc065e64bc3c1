"""What of a checkpoint's optimizer and schedule state a resumed run can take: the whole state
when their config is unchanged; else the config's hyperparameters with each parameter's
saved state mapped by name, and the schedule rebuilt and stepped to where the run stands
(utils/state/resume.py calls these; a warning names what was rebuilt)."""

import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from utils.distributed.sharding import is_sharded
from utils.optim.combined import state_shape
from utils.optim.schedule import (
    SHAPE_KEYS,
    build_scheduler,
    fast_forward,
    is_positional,
    schedule_change,
)
from utils.state.checkpoint import CheckpointError
from utils.state.model_state import load_optimizer_shards, load_whole_optimizer_state
from utils.state.sharded import shards_folder
from utils.state.training_state import parameter_names
from utils.util import unwrap_model

if TYPE_CHECKING:
    from base.base_trainer import BaseTrainer

# The parts of the config whose change the saved optimizer state cannot honour as it is.
OPTIMIZER_KEYS = ("args", "param_groups", "norm_bias_weight_decay", "reference_batch_size")


def restore_optimizer(trainer: "BaseTrainer", state: dict, saved: dict, path: Path) -> bool:
    """The saved optimizer state, whole when its config is unchanged; else the config's
    hyperparameters (learning rates, weight decay, groups) with the saved per-parameter state
    (momentum, Adam's moments) mapped by parameter name. Returns whether the saved
    hyperparameters were restored."""
    optimizer, logger = trainer.optimizer, trainer.logger
    if state.get("optimizer") is None:
        return False
    current = trainer.config.config
    change = optimizer_change(saved, current, state.get("geometry"), trainer.geometry)
    saved_names = state.get("optimizer_params")
    names = parameter_names(trainer.model, optimizer)
    sharded = shards_folder(state, path) is not None
    # An ordinary checkpoint's whole tensors into FSDP's shards: by name, as a sharded one's.
    into_shards = not sharded and is_sharded(unwrap_model(trainer.model))
    if change is None and (saved_names is None or saved_names == names):
        if sharded:
            load_optimizer_shards(trainer.model, optimizer, state, path, whole=True)
            return True
        if into_shards:
            load_whole_optimizer_state(
                trainer.model, optimizer, state, saved_names or names, whole=True
            )
            return True
        try:
            optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError) as error:
            raise CheckpointError(f"cannot restore the optimizer state: {error}") from None
        return True
    change = change or "the optimizer's parameters changed"
    if saved["optimizer"]["type"] != current["optimizer"]["type"] or saved_names is None:
        logger.warning("%s: a new optimizer, its state starts afresh.", change)
        return False
    if sharded or into_shards:  # its state is kept, or taken, by parameter name
        if sharded:
            count = load_optimizer_shards(trainer.model, optimizer, state, path, whole=False)
        else:
            count = load_whole_optimizer_state(
                trainer.model, optimizer, state, saved_names, whole=False
            )
        flat_count = sum(len(group) for group in names)
        logger.warning(
            "%s: learning rates, weight decay and parameter groups as the config says now; the "
            "state of %d of %d parameters (momentum, moments) restored by name.",
            change, count, flat_count,
        )  # fmt: skip
        return False
    saved_index = {
        name: index for index, name in enumerate(n for group in saved_names for n in group)
    }
    mine = optimizer.state_dict()
    flat = [name for group in names for name in group]
    saved_state = state["optimizer"]["state"]
    params = [param for group in optimizer.param_groups for param in group["params"]]
    mine["state"] = {
        index: saved_state[saved_index[name]]
        for index, name in enumerate(flat)
        if name in saved_index
        and saved_index[name] in saved_state
        and fits(saved_state[saved_index[name]], state_shape(optimizer, params[index]))
    }
    optimizer.load_state_dict(mine)
    logger.warning(
        "%s: learning rates, weight decay and parameter groups as the config says now; the "
        "state of %d of %d parameters (momentum, moments) restored by name.",
        change, len(mine["state"]), len(flat),
    )  # fmt: skip
    return False


def fits(saved: dict, shape: torch.Size) -> bool:
    """Whether a parameter's saved state (momentum...) has the shape its optimizer keeps now:
    not when the parameter moved between Muon, which keeps matrices, and another algorithm
    (it starts afresh)."""
    tensors = [value for value in saved.values() if isinstance(value, torch.Tensor)]
    return all(value.dim() == 0 or value.shape == shape for value in tensors)


def optimizer_change(
    saved: dict, current: dict, saved_geometry: dict | None, geometry: dict
) -> str | None:
    """What changed, in words, that the saved optimizer hyperparameters cannot honour: its type,
    args, groups, weight decay of norms and biases, arch.freeze, or (with reference_batch_size)
    the global batch its learning rates are scaled to; None when nothing did."""
    before, now = saved["optimizer"], current["optimizer"]
    if before.get("type") != now.get("type"):
        return f"optimizer.type changed ({before.get('type')} -> {now.get('type')})"
    changed = [f"optimizer.{key}" for key in OPTIMIZER_KEYS if before.get(key) != now.get(key)]
    if saved["arch"].get("freeze") != current["arch"].get("freeze"):
        changed.append("arch.freeze")
    scaled = now.get("reference_batch_size") is not None
    old_batch = (saved_geometry or {}).get("global_batch", geometry["global_batch"])
    if scaled and old_batch != geometry["global_batch"]:
        changed.append(f"the global batch ({old_batch} -> {geometry['global_batch']})")
    return ", ".join(changed) + " changed" if changed else None


def restore_schedule(
    trainer: "BaseTrainer", state: dict, saved: dict, *, hyperparameters_restored: bool
) -> None:
    """The saved schedule state when the schedule is unchanged; else the config's schedule,
    rebuilt and stepped to where the run stands (a warning says so), or for ReduceLROnPlateau,
    which follows a metric, started afresh."""
    scheduler, logger = trainer.lr_scheduler, trainer.logger
    if scheduler is None:
        return
    if state.get("schedule") is not None:
        change = schedule_change(state["schedule"], trainer.schedule_signature)
    else:  # format 1: its config alone
        before, now = saved.get("lr_scheduler") or {}, trainer.config["lr_scheduler"]
        keys = [key for key in SHAPE_KEYS if before.get(key) != now.get(key)]
        change = ", ".join(f"lr_scheduler.{key} changed" for key in keys) or None
    if change is None and not hyperparameters_restored:
        change = "the optimizer's learning rates come from the config"
    elif change is None and state.get("lr_scheduler") is None:
        change = "the checkpoint has no schedule state"
    if change is None:
        scheduler.load_state_dict(state["lr_scheduler"])
        return
    if trainer.start_epoch > trainer.epochs:
        return  # nothing left to train
    if not is_positional(scheduler):
        logger.warning("lr_scheduler: ReduceLROnPlateau starts afresh (%s).", change)
        return
    before = [group["lr"] for group in trainer.optimizer.param_groups]
    num_steps = schedule_position(trainer)
    for group in trainer.optimizer.param_groups:  # where the new schedule starts from
        group["lr"] = group.pop("initial_lr", group["lr"])
    trainer.lr_scheduler = build_scheduler(
        trainer.config,
        trainer.optimizer,
        trainer.steps_per_epoch,
        lr_scale=trainer.lr_scale,
        logger=logger,
    )
    fast_forward(trainer.lr_scheduler, num_steps)
    after = [group["lr"] for group in trainer.optimizer.param_groups]
    logger.warning(
        "lr_scheduler: rebuilt from the config (%s) and stepped %d times, to where the run "
        "stands: learning rate %s (was %s).",
        change, num_steps, f"{after[0]:.4g}", f"{before[0]:.4g}",
    )  # fmt: skip
    trainer.schedule_signature["base_lrs"] = [
        group["initial_lr"] for group in trainer.optimizer.param_groups
    ]


def schedule_position(trainer: "BaseTrainer") -> int:
    """How many times the schedule has stepped at the resume point, in this run's units: epochs
    done, or optimizer steps taken: an accumulation group skipped for a non-finite loss took
    none, and the schedule waited (global_step less step_offset: steps_done after a change of
    batch geometry, which counts the steps anew in this run's batches)."""
    if not trainer.step_per_batch:
        return trainer.state.epoch
    return trainer.state.global_step - trainer.state.step_offset


def steps_done(trainer: "BaseTrainer") -> int:
    """Optimizer steps at the resume point counted in this run's batches: epochs done x steps
    per epoch + the steps of the samples done inside the epoch, rounded down."""
    position = trainer.state
    if position.regrouped:  # another batch geometry: the steps of the samples done
        inside = math.floor(position.samples / trainer.geometry["global_batch"])
    else:
        inside = position.batches // trainer.options["grad_accum_steps"]
    return position.epoch * trainer.steps_per_epoch + inside

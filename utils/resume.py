"""Resuming a checkpoint, decided in one place that reads top to bottom: what of it the current
config, data and process count can take, what is rebuilt instead (named in a warning), and what
is refused (one line, before anything is written)."""

import math
from typing import TYPE_CHECKING

from utils.checkpoint import CheckpointError, load_checkpoint, load_model_state
from utils.distributed import world_size
from utils.sampler import EpochSampler
from utils.schedule import (
    SHAPE_KEYS,
    build_scheduler,
    fast_forward,
    is_positional,
    schedule_change,
)
from utils.timeline import ResumePoint
from utils.util import UserError

if TYPE_CHECKING:
    from base.base_trainer import BaseTrainer

# The parts of the config whose change the saved optimizer state cannot honour as it is.
OPTIMIZER_KEYS = ("args", "param_groups", "norm_bias_weight_decay", "reference_batch_size")
# The batch geometry a mid-epoch position is counted in.
GEOMETRY_KEYS = {
    "batch_size": "data_loader.args.batch_size",
    "world_size": "the number of processes",
    "grad_accum_steps": "trainer.grad_accum_steps",
    "len_epoch": "trainer.len_epoch",
}


def restore(trainer: "BaseTrainer", point: ResumePoint) -> None:
    """Start `trainer` at `point`: after its epoch, or inside it for a mid-epoch checkpoint.

    Fine-tuning (-r CKPT -c CONFIG) takes the weights alone and starts a new run at epoch 1,
    unless --continue carries on the checkpoint's epoch count and training state.
    """
    config, logger, path = trainer.config, trainer.logger, point.path
    trainer.state.timeline = point.timeline
    if path is None:
        return
    # On the CPU: the RNG states must stay CPU tensors, and load_state_dict moves model and
    # optimizer state onto the training device itself.
    state = load_checkpoint(path, map_location="cpu")
    load_model_state(trainer.model, state, path)
    if trainer.ema is not None:  # until its first update, which copies the model anew
        load_model_state(trainer.ema.module, state, path)
    if config.fine_tune and not config.continue_run:
        logger.info(
            "Fine-tuning from %s (epoch %d): its weights, in a new run from epoch 1.",
            path,
            state["epoch"],
        )
        return
    if not config.fine_tune:  # the same run: it must train on the same data
        check_data(trainer, state, path)
    saved = state["config"]
    trainer.state.load_state_dict(state)
    trainer.state.timeline = point.timeline
    trainer.state.parent = path.name if not config.fine_tune else None
    place_in_epoch(trainer, state, path)
    restored = restore_optimizer(trainer, state, saved)
    restore_schedule(trainer, state, saved, hyperparameters_restored=restored)
    if trainer.ema is not None and state.get("ema"):
        trainer.ema.load_state_dict(state["ema"])
    if state.get("grad_scaler") and trainer.scaler.is_enabled():
        trainer.scaler.load_state_dict(state["grad_scaler"])
    if config.fine_tune:
        # A new run (perhaps on other validation data, e.g. a cross-validation fold): its
        # model_best.pth must be the best of this run, not measured against the old one.
        logger.info("Fine-tuning into a new run: the best monitored value starts afresh.")
    elif not trainer.monitor.load_state_dict(state["monitor"]):
        logger.warning("The monitored metric changed: the best value starts afresh.")
    # The same run and timeline: its W&B and MLflow runs too. Another timeline starts new ones.
    if not config.fine_tune and not point.new_timeline:
        trainer.resumed_logger_runs = dict(state.get("logger_runs") or {})
    if trainer.state.inside_epoch:
        trainer.state.rng = own_rng_state(trainer, state["rng"])
    position, where = trainer.state, ""
    if position.inside_epoch:
        samples = f" ({position.samples} samples)" if position.samples else ""
        where = f", then {position.batches} batches{samples} of epoch {trainer.start_epoch}"
    logger.info("Resumed from %s (epoch %d done%s).", path, state["epoch"], where)


def check_data(trainer: "BaseTrainer", state: dict, path: object) -> None:
    """Refuse to continue a run on data other than its checkpoint's (unless
    --allow-data-change): a changed folder silently moves samples between the splits."""
    change = data_change(state.get("data"), trainer.data_fingerprint)
    if change is None:
        return
    if trainer.config.allow_data_change:
        trainer.logger.warning("The data changed since %s (%s): going on with it.", path, change)
        return
    raise UserError(
        f"{path}: the data changed since this checkpoint ({change}); resume on the "
        "checkpoint's data, or pass --allow-data-change to go on with this data"
    )


def data_change(saved: dict | None, current: dict) -> str | None:
    """What differs between two data fingerprints (BaseDataLoader.fingerprint), in words."""
    if saved is None:  # a format 1 checkpoint: nothing to compare with
        return None
    changes = []
    for split, name in (("train", "training split"), ("val", "validation split")):
        before, now = saved.get(split), current.get(split)
        if before == now:
            continue
        if before is None or now is None:
            changes.append(f"{name}: {'none' if before is None else 'one'} in the checkpoint, "
                           f"{'none' if now is None else 'one'} now")  # fmt: skip
        elif before["num_samples"] != now["num_samples"]:
            changes.append(f"{name}: {now['num_samples']} samples, {before['num_samples']} before")
        else:
            changes.append(f"{name}: other samples ({now['num_samples']})")
    return "; ".join(changes) or None


def place_in_epoch(trainer: "BaseTrainer", state: dict, path: object) -> None:
    """Where a mid-epoch checkpoint left off, in this run's batches. The same batch geometry
    continues after the same batch. Another batch size, process count or accumulation continues
    after the same samples of the epoch's order, when the sampler can skip by samples (one
    pass per epoch, the template's EpochSampler): every sample once across the interruption.
    Otherwise a one-line refusal."""
    position = trainer.state
    if not position.inside_epoch:
        return
    saved = state.get("geometry")
    if saved is None:  # format 1: batches only, in the geometry it was saved with
        return
    current = trainer.geometry
    changed = [
        f"{name} {saved[key]} -> {current[key]}"
        for key, name in GEOMETRY_KEYS.items()
        if saved[key] != current[key]
    ]
    if not changed:
        return
    epoch = trainer.start_epoch
    sampler = trainer.train_loader.sampler
    one_pass = saved["len_epoch"] is None and current["len_epoch"] is None
    if not (one_pass and isinstance(sampler, EpochSampler) and position.samples is not None):
        raise UserError(
            f"{path}: stopped inside epoch {epoch}, and {', '.join(changed)}: the rest of that "
            f"epoch cannot be found in the new batches ({'an epoch of trainer.len_epoch batches' if not one_pass else 'a sampler that skips batches, not samples'}); "
            f"resume with the old settings to finish epoch {epoch}, then change them (or resume "
            f"from the checkpoint of epoch {epoch - 1})"
        )
    per_step = current["batch_size"] * current["world_size"]
    position.batches = position.samples // per_step  # this run's count of batches done
    position.regrouped = True
    trainer.logger.warning(
        "%s: stopped inside epoch %d, and %s: the epoch goes on after the %d samples of its "
        "order already trained, in this run's batches (every sample once).",
        path, epoch, ", ".join(changed), position.samples,
    )  # fmt: skip


def restore_optimizer(trainer: "BaseTrainer", state: dict, saved: dict) -> bool:
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
    names = trainer.parameter_names()
    if change is None and (saved_names is None or saved_names == names):
        try:
            optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError) as error:
            raise CheckpointError(f"cannot restore the optimizer state: {error}") from None
        return True
    change = change or "the optimizer's parameters changed"
    if saved["optimizer"]["type"] != current["optimizer"]["type"] or saved_names is None:
        logger.warning("%s: a new optimizer, its state starts afresh.", change)
        return False
    saved_index = {
        name: index for index, name in enumerate(n for group in saved_names for n in group)
    }
    mine = optimizer.state_dict()
    flat = [name for group in names for name in group]
    saved_state = state["optimizer"]["state"]
    mine["state"] = {
        index: saved_state[saved_index[name]]
        for index, name in enumerate(flat)
        if name in saved_index and saved_index[name] in saved_state
    }
    optimizer.load_state_dict(mine)
    logger.warning(
        "%s: learning rates, weight decay and parameter groups as the config says now; the "
        "state of %d of %d parameters (momentum, moments) restored by name.",
        change, len(mine["state"]), len(flat),
    )  # fmt: skip
    return False


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
    done, or optimizer steps (epochs done x steps per epoch + the steps of the samples done
    inside the epoch, rounded down)."""
    position = trainer.state
    if not trainer.step_per_batch:
        return position.epoch
    if position.regrouped:  # another batch geometry: the steps of the samples done
        inside = math.floor(position.samples / trainer.geometry["global_batch"])
    else:
        inside = position.batches // trainer.options["grad_accum_steps"]
    return position.epoch * trainer.steps_per_epoch + inside


def own_rng_state(trainer: "BaseTrainer", saved: list[dict] | dict) -> dict | None:
    """This rank's RNG state in a mid-epoch checkpoint; None when the world size changed (the
    engine then seeds each rank anew from where the run stands)."""
    states = saved if isinstance(saved, list) else [saved]  # older checkpoints: rank 0's only
    if len(states) == world_size():
        return states[trainer.rank]
    trainer.logger.warning(
        "The checkpoint holds the RNG states of %d process(es), this run has %d: the rest of "
        "epoch %d draws new random numbers (dropout, augmentation).",
        len(states),
        world_size(),
        trainer.start_epoch,
    )
    return None

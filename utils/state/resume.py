"""Resuming a checkpoint, decided in one place that reads top to bottom: what of it the current
config, data and process count can take, what is rebuilt instead (named in a warning), and what
is refused (one line, before anything is written)."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from utils.data.batches import remaining_batches
from utils.data.sampler import EpochSampler
from utils.distributed.process_group import said_by_rank0, world_size
from utils.state.checkpoint import load_checkpoint, use_averaged_weights
from utils.state.model_state import load_model_state
from utils.state.optimizer_state import restore_optimizer, restore_schedule, steps_done
from utils.state.timeline import ResumePoint
from utils.util import UserError, derive_seed, seed_everything, set_rng_state, unwrap_model

if TYPE_CHECKING:
    from base.base_trainer import BaseTrainer

# The batch geometry a mid-epoch position is counted in.
GEOMETRY_KEYS = {
    "batch_size": "data_loader.args.batch_size",
    "world_size": "the number of processes",
    "grad_accum_steps": "trainer.grad_accum_steps",
    "len_epoch": "trainer.len_epoch",
}


def restore(trainer: "BaseTrainer", point: ResumePoint) -> None:
    """Start `trainer` at `point` (restore_state), its warnings said once, by rank 0: every rank
    reads the same checkpoint with the same config, and under torchrun each said the same."""
    with said_by_rank0(trainer.logger, trainer.rank, trainer.options["verbosity"]):
        restore_state(trainer, point)


def restore_state(trainer: "BaseTrainer", point: ResumePoint) -> None:
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
    # A fine-tune (a new run) starts from the weights the checkpoint was judged by, as test.py
    # loads them: the averaged ones when its monitor watched a val/ema_ metric. A resume and
    # --continue carry on the trained ones, with the optimizer state that goes with them.
    averaged = point.fine_tune and not config.continue_run and use_averaged_weights(state, "auto")
    load_model_state(trainer.model, state, path, ema=averaged)
    if trainer.ema is not None:  # until its first update, which copies the model anew
        load_model_state(trainer.ema.module, state, path, ema=averaged)
    if trainer.lookahead is not None:  # the slow weights start from the loaded ones
        trainer.lookahead.restart(unwrap_model(trainer.model))
    if point.fine_tune and not config.continue_run:
        logger.info(
            "Fine-tuning from %s (epoch %d): its %s weights, in a new run from epoch 1.",
            path,
            state["epoch"],
            "averaged" if averaged else "trained",
        )
        return
    if not point.fine_tune:  # the same run: it must train on the same data
        check_data(trainer, state, path)
    saved = state["config"]
    trainer.state.load_state_dict(state)
    trainer.state.timeline = point.timeline
    trainer.state.parent = path.name if not point.fine_tune else None
    place_in_epoch(trainer, state, path)
    changed = geometry_changes(state.get("geometry"), trainer.geometry)
    if changed:
        trainer.state.step_offset = trainer.state.global_step - steps_done(trainer)
    if changed and not trainer.state.inside_epoch:  # inside one, place_in_epoch said it
        logger.warning(
            "%s: %s: epoch %d on is trained in this run's batches (steps counted in them).",
            path, ", ".join(changed), trainer.start_epoch,
        )  # fmt: skip
    restored = restore_optimizer(trainer, state, saved, path)
    restore_schedule(trainer, state, saved, hyperparameters_restored=restored)
    if trainer.ema is not None and state.get("ema"):
        trainer.ema.load_state_dict(state["ema"])
    if trainer.lookahead is not None and state.get("lookahead"):
        trainer.lookahead.load_state_dict(state["lookahead"])
    if state.get("grad_scaler") and trainer.scaler.is_enabled():
        trainer.scaler.load_state_dict(state["grad_scaler"])
    if point.fine_tune:
        # A new run (perhaps on other validation data, e.g. a cross-validation fold): its
        # model_best.pth must be the best of this run, not measured against the old one.
        logger.info("Fine-tuning into a new run: the best monitored value starts afresh.")
    elif not trainer.monitor.load_state_dict(state["monitor"]):
        logger.warning("The monitored metric changed: the best value starts afresh.")
    # The same run and timeline: its W&B and MLflow runs too. Another timeline starts new ones.
    if not point.fine_tune and not point.new_timeline:
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


SPLIT_NAMES = {"train": "training split", "val": "validation split", "test": "test split"}


def data_change(
    saved: dict | None, current: dict, splits: tuple[str, ...] = ("train", "val")
) -> str | None:
    """What differs between two data fingerprints (BaseDataLoader.fingerprint) in `splits`, in
    words. By default the splits that train and validate: what a resume continues on."""
    if saved is None:  # a format 1 checkpoint: nothing to compare with
        return None
    changes = []
    for split in splits:
        name, before, now = SPLIT_NAMES[split], saved.get(split), current.get(split)
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


def geometry_changes(saved: dict | None, current: dict) -> list[str]:
    """What of the batch geometry differs from a checkpoint's, in words (none: format 1)."""
    if saved is None:
        return []
    return [
        f"{name} {saved[key]} -> {current[key]}"
        for key, name in GEOMETRY_KEYS.items()
        if saved[key] != current[key]
    ]


def place_in_epoch(trainer: "BaseTrainer", state: dict, path: object) -> None:
    """Where a mid-epoch checkpoint left off, in this run's batches. The same batch geometry
    continues after the same batch. Another batch size, process count or accumulation continues
    after the same samples of the epoch's order, when the sampler can skip by samples (one
    pass per epoch, the template's EpochSampler): every sample once across the interruption.
    Otherwise a one-line refusal."""
    position, epoch = trainer.state, trainer.start_epoch
    if not position.inside_epoch:
        return
    saved_order, order = (state.get("geometry") or {}).get("order"), trainer.geometry.get("order")
    # Another order is no place to go on from, unless the data changed too (check_data has
    # refused that, or warned under --allow-data-change).
    if (
        saved_order
        and order
        and saved_order != order
        and not data_change(state.get("data"), trainer.data_fingerprint)
    ):
        raise UserError(
            f"{path}: stopped inside epoch {epoch}, and the training order's settings changed "
            "(data_loader.args sampler, replacement, num_samples or class_weights, or seed): the "
            f"rest of that epoch is not in the new order; resume with the old settings to finish "
            f"epoch {epoch}, then change them (or resume from the checkpoint of epoch {epoch - 1})"
        )
    changed = geometry_changes(state.get("geometry"), trainer.geometry)
    if not changed:  # or a format 1 checkpoint: batches only, in the geometry it was saved with
        return
    saved, current = state["geometry"], trainer.geometry
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


def restore_rng(trainer: "BaseTrainer", epoch: int, first_batch: int) -> None:
    """At the resume point inside an epoch: this rank's saved random numbers, or (another world
    size) a new stream that is still a function of where the run stands."""
    if trainer.state.rng is not None:
        set_rng_state(trainer.state.rng, trainer.device)
    else:
        seed_everything(derive_seed(trainer.config["seed"], epoch, trainer.rank, first_batch))
    trainer.state.rng = None


@dataclass(frozen=True)
class EpochStart:
    """Where train_epoch begins: after `first_batch` batches of this rank (a mid-epoch resume;
    0 at an epoch's start), until `last_step`; after another batch geometry, after
    `skip_samples` samples of the epoch's order; with `sums`, the metric sums so far."""

    first_batch: int
    last_step: int
    skip_samples: int | None
    sums: dict | None
    samples_per_batch: int  # of all ranks together
    samples_before: int
    one_pass: bool  # the epoch is one pass over the data (no trainer.len_epoch)

    def samples_at(self, step: int) -> int | None:
        """Samples of the epoch's order done after batch `step` (None: not one pass)."""
        done = self.samples_before + (step - self.first_batch) * self.samples_per_batch
        return done if self.one_pass else None


def epoch_start_lr(trainer: "BaseTrainer") -> float:
    """The learning rate the epoch starts with (its "lr" metric): the optimizer's now, or after
    a mid-epoch resume the one the interrupted epoch started with."""
    state = trainer.state
    if not (state.inside_epoch and state.epoch_lr is not None):
        state.epoch_lr = trainer.optimizer.param_groups[0]["lr"]
    return state.epoch_lr


def epoch_start(trainer: "BaseTrainer") -> EpochStart:
    """Where the next epoch begins, taken from the trainer's state (which then starts afresh)."""
    position, loader = trainer.state, trainer.train_loader
    skip_samples = position.samples if position.regrouped else None
    last_step = trainer.len_epoch
    if skip_samples is not None:
        last_step = position.batches + remaining_batches(loader, skip_samples)
    per_batch = loader.batch_size * world_size()
    begin = EpochStart(
        first_batch=position.batches,
        last_step=last_step,
        skip_samples=skip_samples,
        sums=position.epoch_sums,
        samples_per_batch=per_batch,
        samples_before=skip_samples if skip_samples is not None else position.batches * per_batch,
        one_pass=not trainer.options["len_epoch"],
    )
    position.batches, position.samples, position.epoch_sums = 0, 0, None
    position.regrouped = False
    return begin

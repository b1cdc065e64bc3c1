"""A trainer's state as a checkpoint, and back: what the next step depends on, exactly."""

from pathlib import Path
from typing import TYPE_CHECKING

from utils.checkpoint import (
    LATEST,
    CheckpointError,
    load_checkpoint,
    load_model_state,
    save_checkpoint,
    sorted_checkpoints,
    write_text_atomic,
)
from utils.distributed import gather_objects, world_size
from utils.util import (
    StopInEpoch,
    derive_seed,
    get_rng_state,
    seed_everything,
    set_rng_state,
    unwrap_model,
)

if TYPE_CHECKING:
    from base.base_trainer import BaseTrainer


def checkpoint_state(trainer: "BaseTrainer", epoch: int, metrics: dict[str, float]) -> dict:
    """Everything the next epoch depends on, as tensors and built-in types only.

    Called on every rank alike: it gathers each rank's RNG state (a collective).
    """
    return {
        "epoch": epoch,
        "global_step": trainer.global_step,
        "num_skipped_steps": trainer.num_skipped_steps,
        "model": unwrap_model(trainer.model).state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "lr_scheduler": trainer.lr_scheduler.state_dict() if trainer.lr_scheduler else None,
        "ema": trainer.ema.state_dict() if trainer.ema is not None else None,
        "grad_scaler": trainer.scaler.state_dict(),
        "monitor": trainer.monitor.state_dict(),
        "metrics": metrics,
        "config": trainer.config.config,
        # predict.py names its predictions with these, without the training data.
        "class_names": trainer.data.class_names(),
        # One per rank, in rank order: after a mid-epoch resume each rank draws its own
        # dropout and augmentation again, not rank 0's.
        "rng": gather_objects(get_rng_state(trainer.device)),
        # W&B's and MLflow's run ids (rank 0's loggers): a resume continues those runs.
        "logger_runs": dict(trainer.loggers.run_ids),
    }


def write_checkpoint(trainer: "BaseTrainer", state: dict, path: Path) -> None:
    """Save a periodic or mid-epoch checkpoint (rank 0), point `latest` at it, drop the oldest."""
    if trainer.rank != 0:
        return
    save_checkpoint(state, path)
    write_text_atomic(trainer.checkpoint_dir / LATEST, path.name + "\n")
    trainer.logger.info("Saved %s", path)
    keep_last = trainer.options["keep_last"]
    if keep_last:
        for old in sorted_checkpoints(trainer.checkpoint_dir)[:-keep_last]:
            old.unlink()


def save_mid_epoch(trainer: "BaseTrainer", epoch: int, stop: StopInEpoch) -> Path:
    """A checkpoint inside `epoch`: the batches done and every rank's sums of them."""
    path = trainer.checkpoint_dir / f"checkpoint-epoch{epoch}-batch{stop.batches_done}.pth"
    state = checkpoint_state(trainer, epoch - 1, {})
    state["resume_batch"], state["resume_totals"] = stop.batches_done, stop.totals.cpu()
    write_checkpoint(trainer, state, path)
    return path


def save_best(
    trainer: "BaseTrainer",
    state: dict,
    epoch: int,
    *,
    improved: bool,
    in_top_k: bool,
    dropped: list[int],
) -> None:
    """model_best.pth when the monitored metric improved; the top k epochs (trainer.save_top_k)
    as model_best-epoch<N>.pth, deleting those that left the top k. Rank 0 only."""
    if trainer.rank != 0:
        return
    if improved:
        save_checkpoint(state, trainer.checkpoint_dir / "model_best.pth")
        trainer.logger.info(
            "Saved model_best.pth (%s %.4g)", trainer.monitor.key, trainer.monitor.best
        )
    if in_top_k:
        save_checkpoint(state, trainer.checkpoint_dir / f"model_best-epoch{epoch}.pth")
    for old in dropped:
        (trainer.checkpoint_dir / f"model_best-epoch{old}.pth").unlink(missing_ok=True)


def restore(trainer: "BaseTrainer", path: Path) -> None:
    """Load a checkpoint into `trainer`: continue after its epoch (or inside it, for a
    mid-epoch one).

    Fine-tuning (-r CKPT -c CONFIG) takes the weights alone and starts a new run at epoch 1,
    unless --continue asks to carry on the checkpoint's epoch count and training state.
    Optimizer and scheduler state are kept only when their config is unchanged (fine-tuning
    with -c, or --lr, may change them).
    """
    config, logger = trainer.config, trainer.logger
    # On the CPU: the RNG states must stay CPU tensors, and load_state_dict moves model and
    # optimizer state onto the training device itself.
    state = load_checkpoint(path, map_location="cpu")
    load_model_state(trainer.model, state, path)
    if trainer.ema is not None:  # until its first update (then it copies the model anew)
        load_model_state(trainer.ema.module, state, path)
    if config.fine_tune and not config.continue_run:
        logger.info(
            "Fine-tuning from %s (epoch %d): its weights, in a new run from epoch 1.",
            path,
            state["epoch"],
        )
        return
    restored = False  # whether the optimizer state was restored
    for name, component in (
        ("optimizer", trainer.optimizer),
        ("lr_scheduler", trainer.lr_scheduler),
    ):
        if component is None or state[name] is None:
            continue
        # Restored state would silently override a changed config (e.g. a new lr).
        changed = config_change(state["config"], config.config, name)
        if changed:
            logger.warning("%s: its state is not restored.", changed)
            continue
        if name == "lr_scheduler" and not restored:
            # A scheduler's state holds the old optimizer's base learning rates.
            logger.warning("lr_scheduler state is not restored either (new optimizer).")
            continue
        try:
            component.load_state_dict(state[name])
        except (ValueError, KeyError) as error:
            raise CheckpointError(f"{path}: cannot restore {name} state: {error}") from None
        restored = True
    saved_epochs = state["config"]["trainer"]["epochs"]
    if restored and trainer.lr_scheduler is not None and saved_epochs != trainer.epochs:
        logger.warning(
            "trainer.epochs changed (%d -> %d): the learning-rate schedule keeps the state, and "
            "the length, it was saved with; to run a new schedule, fine-tune (-r CKPT -c CONFIG).",
            saved_epochs,
            trainer.epochs,
        )
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
    if not config.fine_tune:  # the same run: its W&B and MLflow runs too
        trainer.resumed_logger_runs = dict(state.get("logger_runs") or {})
    trainer.start_epoch = state["epoch"] + 1
    trainer.global_step = state["global_step"]
    trainer.num_skipped_steps = state.get("num_skipped_steps", 0)
    trainer.resume_batch = state.get("resume_batch", 0)
    trainer.resume_totals = state.get("resume_totals")
    if trainer.resume_batch:
        trainer.resume_rng = own_rng_state(trainer, state["rng"])
    where = f", batch {trainer.resume_batch}" if trainer.resume_batch else ""
    logger.info("Resumed from %s (epoch %d%s done).", path, state["epoch"], where)


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


def config_change(saved: dict, current: dict, name: str) -> str | None:
    """What changed in the config of `name` ("optimizer" or "lr_scheduler") between a
    checkpoint's config and the current one, or None. The optimizer's covers its param_groups
    and arch.freeze, which decide the parameters it holds."""
    saved_section, current_section = saved.get(name) or {}, current.get(name) or {}
    if saved_section.get("type") != current_section.get("type"):
        return f"{name} type changed ({saved_section.get('type')} -> {current_section.get('type')})"
    if saved_section.get("args") != current_section.get("args"):
        return f"{name} args changed"
    if name == "optimizer":
        if saved_section.get("param_groups") != current_section.get("param_groups"):
            return "optimizer.param_groups changed"
        if saved["arch"].get("freeze") != current["arch"].get("freeze"):
            return "arch.freeze changed (the optimizer holds other parameters)"
    return None


def restore_rng(trainer: "BaseTrainer", epoch: int, first_batch: int) -> None:
    """At the resume point inside an epoch: this rank's saved random numbers, or (another world
    size) a new stream that is still a function of where the run stands."""
    if trainer.resume_rng is not None:
        set_rng_state(trainer.resume_rng, trainer.device)
    else:
        seed_everything(derive_seed(trainer.config["seed"], epoch, trainer.rank, first_batch))
    trainer.resume_rng = None

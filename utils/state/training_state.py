"""Where a run stands, and the checkpoints that record it (written by rank 0, agreed by all): a
plain dict of each component's state_dict (model, optimizer, scheduler, averages, loss scaler,
monitor) that describes itself, its place in the run's timeline, its position in samples, the
batch geometry, data and config it trained with, for utils/state/resume.py to read."""

import functools
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from utils.distributed.process_group import gather_objects, on_rank0, sync_buffers
from utils.state.checkpoint import (
    checkpoint_name,
    save_checkpoint,
    sorted_checkpoints,
    write_latest,
)
from utils.state.sharded import KEY as SHARDS_KEY
from utils.state.sharded import (
    checkpoint_group,
    collect_garbage,
    split_state,
    wait_for_shards,
    write_shards,
)
from utils.util import SaveError, StopInEpoch, describe_error, get_rng_state, unwrap_model

if TYPE_CHECKING:
    from base.base_trainer import BaseTrainer

FORMAT = 2  # 1: before the timeline, positions in samples, geometry and data fingerprints


@dataclass
class TrainingState:
    """Where the run stands: what a checkpoint restores besides the model's components (each of
    which has its own state_dict). state_dict() and load_state_dict() follow
    torch.distributed.checkpoint's Stateful protocol; the dict's keys are top-level checkpoint
    keys."""

    epoch: int = 0  # epochs done
    global_step: int = 0  # optimizer steps taken
    num_skipped_steps: int = 0  # batches dropped for a non-finite loss
    # Inside epoch + 1 (a mid-epoch checkpoint): the samples of the epoch's order that all ranks
    # together have done (None when trainer.len_epoch sets the epoch's length), this rank's
    # batches done, and the metric sums so far over all ranks ({"totals", "logged"}: the
    # epoch's, and those at the last log_step read).
    samples: int | None = 0
    batches: int = 0
    epoch_sums: dict[str, torch.Tensor] | None = None
    epoch_lr: float | None = None  # the learning rate the epoch started with (its "lr" metric)
    # global_step less the steps done in this run's batches: not 0 once a resume changed the
    # batch geometry (EMA and Lookahead count steps of one geometry, as the schedule does).
    step_offset: int = 0
    metric_sums: dict[str, list[float]] | None = None  # the last validation's: folds.py pools
    timeline: str = ""  # the id of the run's timeline (utils/state/timeline.py)
    parent: str | None = None  # the checkpoint the next one continues (its file name)
    # Not saved, set by a resume: this rank's RNG state to restore at the resume point, and
    # whether the batch geometry changed inside the epoch (it then goes on after `samples`).
    rng: dict | None = None
    regrouped: bool = False

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "global_step": self.global_step,
            "num_skipped_steps": self.num_skipped_steps,
            "position": {"samples": self.samples, "batches": self.batches, "lr": self.epoch_lr},
            "step_offset": self.step_offset,
            "epoch_sums": self.epoch_sums,
            "metric_sums": self.metric_sums,
            "timeline": {"id": self.timeline, "parent": self.parent},
        }

    def load_state_dict(self, state: dict) -> None:
        """Also reads format 1 checkpoints (resume_batch, resume_totals; no samples, no timeline)."""
        self.epoch, self.global_step = state["epoch"], state["global_step"]
        self.num_skipped_steps = state.get("num_skipped_steps", 0)
        format_1 = {"samples": None, "batches": state.get("resume_batch", 0)}
        position = state.get("position") or format_1
        self.samples, self.batches = position["samples"], position["batches"]
        self.epoch_lr, self.step_offset = position.get("lr"), state.get("step_offset", 0)
        self.epoch_sums = state.get("epoch_sums")
        if self.epoch_sums is None and state.get("resume_totals") is not None:
            totals = state["resume_totals"]
            self.epoch_sums = {"totals": totals, "logged": totals}
        timeline = state.get("timeline") or {}
        self.timeline = timeline.get("id") or self.timeline

    @property
    def inside_epoch(self) -> bool:
        return bool(self.batches)


def parameter_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """The names of each parameter group's parameters, in the optimizer's order: what its
    state_dict's indices stand for (a resume with other groups maps its state by name)."""
    names = {id(param): name for name, param in unwrap_model(model).named_parameters()}
    return [
        [names.get(id(param), "") for param in group["params"]] for group in optimizer.param_groups
    ]


def checkpoint_state(trainer: "BaseTrainer", metrics: dict[str, float]) -> tuple[dict, dict | None]:
    """Everything the next step depends on, as tensors and built-in types only: (the
    checkpoint file's contents, None); with distributed.strategy "fsdp" (the checkpoint file's,
    the sharded tensors of the model and the optimizer for a DCP folder: utils/state/sharded.py).

    Called on every rank alike: it gathers each rank's RNG state (a collective).
    """
    monitored = trainer.monitor.key
    shards = None
    if trainer.config["distributed"]["strategy"] == "fsdp":
        # Buffers (BatchNorm's statistics) are not sharded: DCP writes one rank's copy, any
        # rank's. Rank 0's, as DDP's checkpoints hold and validation uses (sync_buffers).
        sync_buffers(unwrap_model(trainer.model))
        shards, optimizer_state = split_state(trainer.model, trainer.optimizer)
    else:
        optimizer_state = trainer.optimizer.state_dict()
    state = {
        "format": FORMAT,
        **trainer.state.state_dict(),
        "model": None if shards else unwrap_model(trainer.model).state_dict(),
        "optimizer": optimizer_state,
        "optimizer_params": parameter_names(trainer.model, trainer.optimizer),
        "lr_scheduler": trainer.lr_scheduler.state_dict() if trainer.lr_scheduler else None,
        "schedule": trainer.schedule_signature,
        "ema": trainer.ema.state_dict() if trainer.ema is not None else None,
        "lookahead": trainer.lookahead.state_dict() if trainer.lookahead is not None else None,
        "grad_scaler": trainer.scaler.state_dict(),
        "monitor": trainer.monitor.state_dict(),
        "metrics": metrics,
        "config": trainer.config.config,
        "geometry": trainer.geometry,
        "data": trainer.data_fingerprint,
        # The weights the monitor judged: test.py, predict.py and export.py load these.
        "weights": "ema" if monitored.startswith("val/ema_") else "model",
        # predict.py names its predictions with these, and reads a table's columns by name.
        "class_names": trainer.data.class_names(),
        "feature_names": trainer.data.feature_names(),
        # One per rank, in rank order: after a mid-epoch resume each rank draws its own
        # dropout and augmentation again, not rank 0's.
        "rng": gather_objects(get_rng_state(trainer.device)),
        # W&B's and MLflow's run ids (rank 0's loggers): a resume continues those runs.
        "logger_runs": dict(trainer.loggers.run_ids),
    }
    return state, shards


@dataclass
class PendingSave:
    """A save whose shards are being written in the background (trainer.async_checkpoint):
    `commit` writes its checkpoint files once `future` is done."""

    future: Future
    commit: Callable[[], None]


def save(
    trainer: "BaseTrainer",
    parts: tuple[dict, dict | None],
    path: Path | None,
    *,
    improved: bool = False,
    in_top_k: bool = False,
    dropped: tuple[int, ...] = (),
    background: bool = False,
) -> None:
    """Save checkpoint_state's `parts` at `path` (a periodic, last or mid-epoch checkpoint;
    None: not), and as the best models: the shards by every rank, then the files by rank 0.
    Every rank agrees on the outcome: a save that failed (a full disk) stops them all with the
    same one-line SaveError, so none is left waiting in a collective. background: the shards
    are written while training goes on, and the files when the next save begins
    (finish_pending): until then the checkpoint before it is the one a resume takes."""
    state, shards = parts
    future = None
    if background and trainer.checkpoint_group is None:
        trainer.checkpoint_group = checkpoint_group()
    if shards is not None and (path is not None or improved or in_top_k):
        group = background and trainer.checkpoint_group
        try:  # DCP raises every rank's error on every rank
            state[SHARDS_KEY], future = write_shards(
                trainer.checkpoint_dir, shards, trainer.state.global_step, background=group
            )
        except Exception as error:
            raise SaveError(
                f"{trainer.checkpoint_dir}: cannot save the shards ({describe_error(error)}); "
                f"{intact(trainer)}"
            ) from None

    def write() -> None:
        try:
            if path is not None:
                write_checkpoint(trainer, state, path)
            save_best(trainer, state, improved=improved, in_top_k=in_top_k, dropped=dropped)
            if shards is not None:  # the shards of checkpoints just dropped
                collect_garbage(trainer.checkpoint_dir)
        except OSError as error:
            raise SaveError(
                f"{error.filename or path}: cannot save ({error.strerror or error}); "
                f"{intact(trainer)}"
            ) from None

    if future is not None:
        trainer.pending_save = PendingSave(future, functools.partial(on_rank0, write))
        return
    on_rank0(write)


def intact(trainer: "BaseTrainer") -> str:
    return (
        "the checkpoints saved before are intact: make room, then resume with -r "
        f"{trainer.checkpoint_dir}"
    )


def finish_pending(trainer: "BaseTrainer") -> None:
    """Wait for a background save's shards (every rank), then write its checkpoint files."""
    pending, trainer.pending_save = trainer.pending_save, None
    if pending is None:
        return
    try:
        wait_for_shards(pending.future)
    except Exception as error:
        raise SaveError(
            f"{trainer.checkpoint_dir}: cannot save the shards ({describe_error(error)}); "
            f"{intact(trainer)}"
        ) from None
    pending.commit()


def save_inside_epoch(trainer: "BaseTrainer", epoch: int, stop: StopInEpoch) -> Path:
    """The checkpoint of a stop inside `epoch`: where the epoch stands (batches, samples, metric
    sums), so that the next run goes on from there in any batch geometry."""
    finish_pending(trainer)  # the epoch before's background save first: it is the parent
    state = trainer.state
    state.batches, state.samples, state.epoch_sums = stop.batches, stop.samples, stop.sums
    path = trainer.checkpoint_dir / checkpoint_name(epoch, state.global_step)
    save(trainer, checkpoint_state(trainer, {}), path)
    return path


def save_epoch_end(
    trainer: "BaseTrainer",
    epoch: int,
    metrics: dict[str, float],
    *,
    last: bool,
    improved: bool,
    in_top_k: bool,
    dropped: list[int],
) -> Path:
    """Epoch `epoch` done: its checkpoint every save_period epochs and at the `last` one, and the
    best models. Returns the checkpoint's path (where a stop after it resumes)."""
    finish_pending(trainer)
    trainer.state.epoch = epoch
    parts = checkpoint_state(trainer, metrics)  # on every rank: it gathers the RNG states
    path = trainer.checkpoint_dir / checkpoint_name(epoch)
    periodic = epoch % trainer.options["save_period"] == 0 or last
    # The last epoch's save is whole before the run ends; the others may write as it trains.
    background = trainer.options["async_checkpoint"] and not last
    save(trainer, parts, path if periodic else None, improved=improved, in_top_k=in_top_k,
         dropped=tuple(dropped), background=background)  # fmt: skip
    return path


def write_checkpoint(trainer: "BaseTrainer", state: dict, path: Path) -> None:
    """Save a periodic or mid-epoch checkpoint, point `latest` at it, drop the oldest."""
    save_checkpoint(state, path)
    write_latest(trainer.checkpoint_dir, path, trainer.state.timeline)
    trainer.state.parent = path.name  # the next checkpoint continues this one
    trainer.logger.info("Saved %s", path)
    drop_oldest(trainer.checkpoint_dir, trainer.options["keep_last"])


def drop_oldest(checkpoint_dir: Path, keep_last: int | None) -> None:
    """Delete all but the newest keep_last checkpoints (None: keep all)."""
    if keep_last:
        for old in sorted_checkpoints(checkpoint_dir)[:-keep_last]:
            old.unlink(missing_ok=True)


def save_best(
    trainer: "BaseTrainer", state: dict, *, improved: bool, in_top_k: bool, dropped: tuple[int, ...]
) -> None:
    """model_best.pth when the monitored metric improved; the top k epochs (trainer.save_top_k)
    as model_best-epoch<N>.pth, deleting those that left the top k."""
    if improved:
        save_checkpoint(state, trainer.checkpoint_dir / "model_best.pth")
        trainer.logger.info(
            "Saved model_best.pth (%s %.4g)", trainer.monitor.key, trainer.monitor.best
        )
    if in_top_k:
        save_checkpoint(state, trainer.checkpoint_dir / f"model_best-epoch{state['epoch']}.pth")
    for old in dropped:
        (trainer.checkpoint_dir / f"model_best-epoch{old}.pth").unlink(missing_ok=True)

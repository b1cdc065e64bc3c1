"""Base class for trainers: the epoch loop, checkpoints, resume, monitoring, early stopping and
stopping on a signal.

A subclass supplies train_epoch() and validate(); see trainer/trainer.py.
"""

import abc
import logging
import signal
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.contrib.logging import logging_redirect_tqdm

from logger import TensorboardWriter
from utils import (
    amp_dtype,
    derive_seed,
    get_rng_state,
    load_checkpoint,
    save_checkpoint,
    seed_everything,
    set_rng_state,
    unwrap_model,
)
from utils.checkpoint import (
    LATEST,
    CheckpointError,
    load_model_state,
    sorted_checkpoints,
    write_text_atomic,
)
from utils.distributed import all_reduce_max, gather_objects, world_size
from utils.monitor import Monitor
from utils.signals import StopRequest
from utils.timing import Stopwatch


class Interrupted(Exception):
    """Training stopped on a signal; `path` is the checkpoint to resume from."""

    def __init__(self, signum: int, path: Path) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}; resume with: -r {path}")
        self.signum = signum
        self.path = path


class StopInEpoch(Exception):
    """Raised by train_epoch when a stop was requested: where the epoch stands."""

    def __init__(self, batches_done: int, totals: torch.Tensor) -> None:
        super().__init__(f"stopped after {batches_done} batches")
        self.batches_done = batches_done
        self.totals = totals


class TrainingError(Exception):
    """Training cannot go on (e.g. a non-finite loss); reported in one line, exit code 1."""


class BaseTrainer(abc.ABC):
    """Runs epochs start_epoch..epochs, saving checkpoints and the best model as it goes."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        config: Any,  # parse_config.ConfigParser
        device: torch.device,
        lr_scheduler: Any = None,
        logger: logging.Logger | None = None,
        rank: int = 0,
    ) -> None:
        self.config = config
        self.device = device
        self.model = model.to(device)
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.logger = logger or logging.getLogger("trainer")
        self.rank = rank
        trainer_config = config["trainer"]
        self.epochs = trainer_config["epochs"]
        self.save_period = trainer_config["save_period"]
        self.keep_last = trainer_config["keep_last"]
        self.verbosity = trainer_config["verbosity"]
        self.monitor = Monitor(
            config.monitor_mode, config.monitor_key, trainer_config["early_stop"]
        )
        self.amp_dtype = amp_dtype(trainer_config["amp"])
        # fp16 gradients underflow without loss scaling; disabled, the scaler passes through.
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.amp_dtype == torch.float16)
        self.start_epoch = 1
        self.global_step = 0
        # Batches dropped for a non-finite loss (trainer.nonfinite "skip"), over the whole run.
        self.num_skipped_steps = 0
        # Where a mid-epoch checkpoint left off: batches already done and their metric sums.
        self.resume_batch = 0
        self.resume_totals: torch.Tensor | None = None
        self.checkpoint_dir = Path(config.checkpoint_dir)
        # Created in train(): constructing a trainer has no side effects.
        self.writer = TensorboardWriter(config.log_dir, enabled=False)
        self.stop = StopRequest()

    @abc.abstractmethod
    def train_epoch(self, epoch: int) -> dict[str, float]:
        """Train one epoch; return {"train/loss": ..., "train/<metric>": ..., "train/num_samples": n}.

        Poll self.stop between steps and raise StopInEpoch when asked to stop.
        """

    @abc.abstractmethod
    def validate(self) -> dict[str, float]:
        """Evaluate the validation data; return {"val/loss": ..., ...} ({} without validation data)."""

    def on_train_start(self) -> None:  # noqa: B027 (an optional hook, not abstract)
        """Called once before the first epoch, after the writer exists (log data, sizes, images)."""

    def train(self) -> dict[str, float]:
        """Train until the last epoch or an early stop; return the last epoch's metrics.

        Raises Interrupted after saving a checkpoint when SIGTERM, SIGINT or SIGUSR1 arrives.
        """
        self.writer = TensorboardWriter(
            self.config.log_dir, enabled=self.config["trainer"]["tensorboard"] and self.rank == 0
        )
        metrics: dict[str, float] = {}
        try:
            # Log lines go above the progress bar instead of through it.
            with logging_redirect_tqdm(), self.stop:
                self.on_train_start()
                if self.start_epoch > self.epochs:
                    self.logger.info("All %d epochs are already done.", self.epochs)
                for epoch in range(self.start_epoch, self.epochs + 1):
                    metrics = self._run_epoch(epoch)
                    if self.monitor.should_stop:
                        self.logger.info(
                            "Early stop: %s did not improve for %d epochs.",
                            self.monitor.key,
                            self.monitor.early_stop,
                        )
                        break
        finally:
            self.writer.close()
        return metrics

    def _run_epoch(self, epoch: int) -> dict[str, float]:
        if self.resume_batch == 0:
            # Augmentation, dropout and worker seeds become a function of (seed, epoch, rank),
            # so an epoch replays the same way after a resume. (A mid-epoch resume instead
            # continues from the RNG state saved with it.)
            seed_everything(derive_seed(self.config["seed"], epoch, self.rank))
        # The rate this epoch starts training with (per-step schedules change it as they go).
        learning_rate = self.optimizer.param_groups[0]["lr"]
        start = time.perf_counter()
        stopwatch = Stopwatch(self.device)
        stopwatch.start()
        try:
            metrics = self.train_epoch(epoch)
        except StopInEpoch as stop:
            path = self.checkpoint_dir / f"checkpoint-epoch{epoch}-batch{stop.batches_done}.pth"
            state = self.checkpoint_state(epoch - 1, {})
            state["resume_batch"] = stop.batches_done
            state["resume_totals"] = stop.totals.cpu()
            self._save(state, path)
            raise Interrupted(self.stop.signum or signal.SIGTERM, path) from None
        train_seconds = stopwatch.stop()
        metrics.update(self.validate())
        metrics["time/epoch_seconds"] = time.perf_counter() - start
        metrics["time/train_samples_per_second"] = metrics.pop("train/num_samples") / train_seconds
        # How much of the training time went to waiting for batches: near 1, the input pipeline
        # is the bottleneck (more num_workers, faster transforms).
        metrics["time/data_wait_fraction"] = metrics.pop("time/data_wait_seconds") / train_seconds
        metrics["lr"] = learning_rate
        self._step_scheduler(metrics)

        improved = self.monitor.update(metrics)
        self.writer.add_scalars(metrics, epoch)
        summary = "  ".join(f"{key} {value:.4g}" for key, value in metrics.items())
        self.logger.info(
            "epoch %d/%d  %s%s", epoch, self.epochs, summary, "  *best*" if improved else ""
        )
        state = self.checkpoint_state(epoch, metrics)
        # The last epoch (also an early-stopped or interrupted one) is always saved, so a run
        # always ends resumable.
        path = self.checkpoint_dir / f"checkpoint-epoch{epoch}.pth"
        # A signal that came during validation: every rank must agree to stop here. The agreed
        # value decides, not self.stop.signum: a signal that lands just after the agreement
        # reaches one rank first, which alone would then stop. It stays pending instead, and
        # every rank stops at the next agreement.
        agreed = torch.tensor(self.stop.signum or 0, device=self.device)
        agreed_signum = int(all_reduce_max(agreed).item()) or None
        stopping = self.monitor.should_stop or agreed_signum is not None
        if epoch % self.save_period == 0 or epoch == self.epochs or stopping:
            self._save(state, path)
        if improved and self.rank == 0:
            save_checkpoint(state, self.checkpoint_dir / "model_best.pth")
            self.logger.info("Saved model_best.pth (%s %.4g)", self.monitor.key, self.monitor.best)
        if agreed_signum is not None and epoch < self.epochs:
            raise Interrupted(agreed_signum, path)
        return metrics

    def _save(self, state: dict, path: Path) -> None:
        """Save a periodic or mid-epoch checkpoint, point `latest` at it, drop the oldest."""
        if self.rank != 0:
            return
        save_checkpoint(state, path)
        write_text_atomic(self.checkpoint_dir / LATEST, path.name + "\n")
        self.logger.info("Saved %s", path)
        if self.keep_last:
            for old in sorted_checkpoints(self.checkpoint_dir)[: -self.keep_last]:
                old.unlink()

    def _step_scheduler(self, metrics: dict[str, float]) -> None:
        if self.lr_scheduler is None or self.config["lr_scheduler"]["interval"] != "epoch":
            return
        if isinstance(self.lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            # Plateau needs the monitored value; without a monitor it watches val/loss or train/loss.
            key = self.monitor.key or ("val/loss" if "val/loss" in metrics else "train/loss")
            self.lr_scheduler.step(metrics[key])
        else:
            self.lr_scheduler.step()

    def checkpoint_state(self, epoch: int, metrics: dict[str, float]) -> dict:
        """Everything the next epoch depends on, as tensors and built-in types only.

        Called on every rank alike: it gathers each rank's RNG state (a collective).
        """
        model = unwrap_model(self.model)
        return {
            "epoch": epoch,
            "global_step": self.global_step,
            "num_skipped_steps": self.num_skipped_steps,
            "model": model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler else None,
            "grad_scaler": self.scaler.state_dict(),
            "monitor": self.monitor.state_dict(),
            "metrics": metrics,
            "config": self.config.config,
            # One per rank, in rank order: after a mid-epoch resume each rank draws its own
            # dropout and augmentation again, not rank 0's.
            "rng": gather_objects(get_rng_state(self.device)),
        }

    def resume(self, path: Path) -> None:
        """Load a checkpoint; continue after its epoch (or inside it, for a mid-epoch one).

        Fine-tuning (-r CKPT -c CONFIG) takes the weights alone and starts a new run at epoch 1,
        unless --continue asks to carry on the checkpoint's epoch count and training state.
        Optimizer and scheduler state are kept only when their config is unchanged (fine-tuning
        with -c, or --lr, may change them).
        """
        # On the CPU: the RNG states must stay CPU tensors, and load_state_dict moves model and
        # optimizer state onto the training device itself.
        state = load_checkpoint(path, map_location="cpu")
        load_model_state(self.model, state, path)
        if self.config.fine_tune and not self.config.continue_run:
            self.logger.info(
                "Fine-tuning from %s (epoch %d): its weights, in a new run from epoch 1.",
                path,
                state["epoch"],
            )
            return
        restored = False  # whether the optimizer state was restored
        for name, component in (("optimizer", self.optimizer), ("lr_scheduler", self.lr_scheduler)):
            if component is None or state[name] is None:
                continue
            # Restored state would silently override a changed config (e.g. a new lr).
            changed = config_change(state["config"], self.config.config, name)
            if changed:
                self.logger.warning("%s: its state is not restored.", changed)
                continue
            if name == "lr_scheduler" and not restored:
                # A scheduler's state holds the old optimizer's base learning rates.
                self.logger.warning("lr_scheduler state is not restored either (new optimizer).")
                continue
            try:
                component.load_state_dict(state[name])
            except (ValueError, KeyError) as error:
                raise CheckpointError(f"{path}: cannot restore {name} state: {error}") from None
            restored = True
        if state.get("grad_scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(state["grad_scaler"])
        if self.config.fine_tune:
            # A new run (perhaps on other validation data, e.g. a cross-validation fold): its
            # model_best.pth must be the best of this run, not measured against the old one.
            self.logger.info("Fine-tuning into a new run: the best monitored value starts afresh.")
        elif not self.monitor.load_state_dict(state["monitor"]):
            self.logger.warning("The monitored metric changed: the best value starts afresh.")
        self.start_epoch = state["epoch"] + 1
        self.global_step = state["global_step"]
        self.num_skipped_steps = state.get("num_skipped_steps", 0)
        self.resume_batch = state.get("resume_batch", 0)
        self.resume_totals = state.get("resume_totals")
        self._restore_rng(state["rng"])
        where = f", batch {self.resume_batch}" if self.resume_batch else ""
        self.logger.info("Resumed from %s (epoch %d%s done).", path, state["epoch"], where)

    def _restore_rng(self, saved: list[dict] | dict) -> None:
        """This rank's own RNG state; a new one derived from where the run stands when the
        world size changed. (Only a mid-epoch resume needs it: every epoch reseeds.)"""
        states = saved if isinstance(saved, list) else [saved]  # older checkpoints: rank 0's only
        if len(states) == world_size():
            set_rng_state(states[self.rank], self.device)
        elif self.resume_batch:
            self.logger.warning(
                "The checkpoint holds the RNG states of %d process(es), this run has %d: the rest "
                "of epoch %d draws new random numbers (dropout, augmentation).",
                len(states),
                world_size(),
                self.start_epoch,
            )
            seed_everything(
                derive_seed(self.config["seed"], self.start_epoch, self.rank, self.resume_batch)
            )


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

"""Base class for trainers: the epoch loop, checkpoints, resume, monitoring and early stopping.

A subclass supplies train_epoch() and evaluate(); see trainer/trainer.py.
"""

import abc
import logging
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.contrib.logging import logging_redirect_tqdm

from logger import TensorboardWriter
from utils import (
    derive_seed,
    get_rng_state,
    load_checkpoint,
    save_checkpoint,
    seed_everything,
    set_rng_state,
)
from utils.checkpoint import CheckpointError, load_model_state
from utils.monitor import Monitor


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
        self.verbosity = trainer_config["verbosity"]
        self.monitor = Monitor(
            config.monitor_mode, config.monitor_key, trainer_config["early_stop"]
        )
        self.start_epoch = 1
        self.global_step = 0
        self.checkpoint_dir = Path(config.checkpoint_dir)
        # Created in train(): constructing a trainer has no side effects.
        self.writer = TensorboardWriter(config.log_dir, enabled=False)

    @abc.abstractmethod
    def train_epoch(self, epoch: int) -> dict[str, float]:
        """Train one epoch; return {"train/loss": ..., "train/<metric>": ...}."""

    @abc.abstractmethod
    def validate(self) -> dict[str, float]:
        """Evaluate the validation data; return {"val/loss": ..., ...} ({} without validation data)."""

    def on_train_start(self) -> None:  # noqa: B027 (an optional hook, not abstract)
        """Called once before the first epoch, after the writer exists (log data, sizes, images)."""

    def train(self) -> dict[str, float]:
        """Train until the last epoch or an early stop; return the last epoch's metrics."""
        self.writer = TensorboardWriter(
            self.config.log_dir, enabled=self.config["trainer"]["tensorboard"] and self.rank == 0
        )
        metrics: dict[str, float] = {}
        try:
            # Log lines go above the progress bar instead of through it.
            with logging_redirect_tqdm():
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
        # Augmentation, dropout and worker seeds become a function of (seed, epoch, rank),
        # so an epoch replays the same way after a resume.
        seed_everything(derive_seed(self.config["seed"], epoch, self.rank))
        start = time.perf_counter()
        metrics = self.train_epoch(epoch)
        train_seconds = time.perf_counter() - start
        metrics.update(self.validate())
        metrics["time/epoch_seconds"] = time.perf_counter() - start
        metrics["time/train_samples_per_second"] = metrics.pop("train/num_samples") / train_seconds
        metrics["lr"] = self.optimizer.param_groups[0]["lr"]
        self._step_scheduler(metrics)

        improved = self.monitor.update(metrics)
        self.writer.add_scalars(metrics, epoch)
        summary = "  ".join(f"{key} {value:.4g}" for key, value in metrics.items())
        self.logger.info(
            "epoch %d/%d  %s%s", epoch, self.epochs, summary, "  *best*" if improved else ""
        )
        if self.rank == 0:
            state = self.checkpoint_state(epoch, metrics)
            # The last epoch (also an early-stopped one) is always saved, so a run ends resumable.
            is_last = epoch == self.epochs or self.monitor.should_stop
            if epoch % self.save_period == 0 or is_last:
                path = self.checkpoint_dir / f"checkpoint-epoch{epoch}.pth"
                save_checkpoint(state, path)
                self.logger.info("Saved %s", path)
            if improved:
                save_checkpoint(state, self.checkpoint_dir / "model_best.pth")
                self.logger.info(
                    "Saved model_best.pth (%s %.4g)", self.monitor.key, self.monitor.best
                )
        return metrics

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
        """Everything the next epoch depends on, as tensors and built-in types only."""
        model = getattr(self.model, "module", self.model)  # unwrap DDP: no "module." prefixes
        return {
            "epoch": epoch,
            "global_step": self.global_step,
            "model": model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler else None,
            "monitor": self.monitor.state_dict(),
            "metrics": metrics,
            "config": self.config.config,
            "rng": get_rng_state(),
        }

    def resume(self, path: Path) -> None:
        """Load a checkpoint; continue after its epoch. Optimizer and scheduler state are kept only
        when their types match the current config (fine-tuning with -c may change them)."""
        state = load_checkpoint(path, map_location=self.device)
        saved_config = state["config"]
        load_model_state(self.model, state, path)
        for name, component in (("optimizer", self.optimizer), ("lr_scheduler", self.lr_scheduler)):
            saved_section = saved_config.get(name) or {}
            current_section = self.config[name] or {}
            if component is None or state[name] is None:
                continue
            if saved_section.get("type") != current_section.get("type"):
                self.logger.warning(
                    "%s type changed (%s -> %s): its state is not restored.",
                    name,
                    saved_section.get("type"),
                    current_section.get("type"),
                )
                continue
            try:
                component.load_state_dict(state[name])
            except (ValueError, KeyError) as error:
                raise CheckpointError(f"{path}: cannot restore {name} state: {error}") from None
        if not self.monitor.load_state_dict(state["monitor"]):
            self.logger.warning("The monitored metric changed: the best value starts afresh.")
        set_rng_state(state["rng"])
        self.start_epoch = state["epoch"] + 1
        self.global_step = state["global_step"]
        self.logger.info("Resumed from %s (epoch %d).", path, state["epoch"])

"""What every logger (TensorBoard, CSV, W&B, MLflow) implements, and what it opens with."""

import abc
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass(frozen=True)
class RunInfo:
    """The run a logger opens for."""

    log_dir: Path  # this run's log folder (a fold's own, in cross-validation)
    experiment_dir: Path  # saved/log/<name>, which the experiment's runs share (a copy: its log/)
    config: dict  # the effective config: the run's parameters
    experiment: str  # the config's name
    run_name: str  # the run id, and "/fold-<i>" when training one fold
    # Where training starts: epochs done, batches done in the next one (a mid-epoch resume), and
    # the global step.
    epochs_done: int
    batches_done: int
    start_step: int
    # The tracking loggers' run ids from the checkpoint: a resumed run continues its own run.
    resumed_ids: dict[str, str]


class ExperimentLogger(abc.ABC):
    """One destination of a run's values. Values are Python floats, read at the loop's existing
    sync points; `step` is the global step (optimizer steps so far), the x-axis of every curve."""

    name = ""  # its name in trainer.loggers
    takes_images = False

    @abc.abstractmethod
    def log_step(self, values: dict[str, float], *, step: int, epoch: int, batch: int) -> None:
        """Every log_step batches: e.g. {"train/step_loss": ..., "train/lr": ...} after `batch`
        batches of `epoch`."""

    @abc.abstractmethod
    def log_epoch(self, metrics: dict[str, float], *, step: int, epoch: int) -> None:
        """Once per epoch: every train/, val/ and time/ metric and lr."""

    def log_image(self, tag: str, image: torch.Tensor, step: int) -> None:  # noqa: B027
        """image: (3, H, W) floats in [0, 1]. Loggers that keep no images ignore it."""

    def run_id(self) -> str | None:
        """The id of the tracking run, kept in checkpoints to continue it on resume."""
        return None

    @abc.abstractmethod
    def close(self, *, finished: bool) -> None:
        """Flush and release; `finished` False when training stopped early (signal, error)."""


class ScalarLogger(ExperimentLogger):
    """A logger that keeps one curve per name against the global step: the epoch becomes a
    curve of its own ("epoch"), which maps steps to epochs."""

    @abc.abstractmethod
    def log_scalars(self, values: dict[str, float], step: int) -> None:
        """One point per name at `step`."""

    def log_step(self, values: dict[str, float], *, step: int, epoch: int, batch: int) -> None:
        self.log_scalars(values, step)

    def log_epoch(self, metrics: dict[str, float], *, step: int, epoch: int) -> None:
        self.log_scalars({**metrics, "epoch": epoch}, step)


def image_pixels(image: torch.Tensor) -> np.ndarray:
    """(3, H, W) floats in [0, 1] as (H, W, 3) bytes, what W&B and MLflow take."""
    return (image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()

"""The run's loggers (trainer.loggers), fed together: the trainer logs each value once and every
logger receives it at the same global step. Only rank 0 logs."""

import contextlib
import importlib.util
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from logger.csv_logger import CsvLogger
from logger.experiment_logger import ExperimentLogger, RunInfo
from logger.tracking import MlflowLogger, WandbLogger
from logger.visualization import TensorboardLogger
from utils.evaluation.confusion import draw_confusion_matrix, image_tensor
from utils.util import UserError, describe_error

if TYPE_CHECKING:
    from base.base_trainer import BaseTrainer

# What the optional loggers import, and the package that provides it (requirements-extras.txt).
# MLflow's SQLite store (the default tracking URI) also needs sqlalchemy and alembic.
PACKAGES = {"wandb": {"wandb": "wandb"}, "mlflow": {"mlflow": "mlflow-skinny"}}
SQLITE_PACKAGES = {"sqlalchemy": "sqlalchemy", "alembic": "alembic"}
# In a checkpoint's logger_runs, beside the tracking run ids: the log folder they were sent from.
LOG_DIR_KEY = "log_dir"


def selected_loggers(options: dict) -> list[str]:
    """trainer.loggers, less TensorBoard when trainer.tensorboard is false."""
    return [name for name in options["loggers"] if name != "tensorboard" or options["tensorboard"]]


def check_logger_packages(options: dict, source: str) -> None:
    """A one-line error, before anything is written, when a selected logger's package is missing."""
    for name in selected_loggers(options):
        modules = dict(PACKAGES.get(name, {}))
        uri = options["mlflow_tracking_uri"]
        if name == "mlflow" and (uri is None or uri.startswith("sqlite:")):
            modules.update(SQLITE_PACKAGES)
        for module, package in modules.items():
            if importlib.util.find_spec(module) is None:
                raise UserError(
                    f'{source}: trainer.loggers: "{name}" needs the package {package}, which is '
                    f"not installed: pip install -r requirements-extras.txt (or {package})"
                )


class Loggers:
    """Every open logger, each fed the same values. A logger that fails (a full disk, a lost
    server) is warned about once and dropped: training goes on with the others."""

    def __init__(self, loggers: list[ExperimentLogger], logger: logging.Logger) -> None:
        self.loggers, self.logger = loggers, logger
        # Kept in checkpoints, also for a logger dropped later: a resume continues its run.
        self.run_ids = {item.name: item.run_id() for item in loggers if item.run_id() is not None}

    @property
    def takes_images(self) -> bool:
        return any(item.takes_images for item in self.loggers)

    def log_step(self, values: dict[str, float], *, step: int, epoch: int, batch: int) -> None:
        self.each(lambda item: item.log_step(values, step=step, epoch=epoch, batch=batch))

    def log_epoch(self, metrics: dict[str, float], *, step: int, epoch: int) -> None:
        self.each(lambda item: item.log_epoch(metrics, step=step, epoch=epoch))

    def log_image(self, tag: str, image: torch.Tensor, step: int) -> None:
        self.each(lambda item: item.log_image(tag, image, step))

    def log_confusion_matrix(self, counts: torch.Tensor, class_names: list[str], step: int) -> None:
        """counts (C, C) drawn as val/confusion_matrix, only when a logger takes images."""
        if self.takes_images:
            image = image_tensor(draw_confusion_matrix(counts, class_names))
            self.log_image("val/confusion_matrix", image, step)

    def close(self, *, finished: bool) -> None:
        self.each(lambda item: item.close(finished=finished))
        self.loggers = []

    def each(self, call: Callable[[ExperimentLogger], None]) -> None:
        for item in list(self.loggers):
            try:
                call(item)
            except Exception as error:  # whatever a logger raises is its own failure, not the run's
                self.loggers.remove(item)
                self.logger.warning(
                    "Logger %s failed (%s): it logs nothing more; training goes on.",
                    item.name,
                    describe_error(error),
                )
                with contextlib.suppress(Exception):  # release what it holds, if it still can
                    item.close(finished=False)


def open_logger(name: str, run: RunInfo, options: dict) -> ExperimentLogger:
    if name == "tensorboard":
        return TensorboardLogger(run.log_dir, run.start_step)
    if name == "csv":
        return CsvLogger(run.log_dir, run.epochs_done, run.batches_done)
    if name == "wandb":
        return WandbLogger(run, options)
    return MlflowLogger(run, options)


def open_loggers(trainer: "BaseTrainer") -> Loggers:
    """The loggers trainer.loggers selects, on rank 0 (none elsewhere), opened where training
    starts. One that cannot start (e.g. no W&B login) is warned about and left out."""
    config, logger = trainer.config, trainer.logger
    if trainer.rank != 0:
        return Loggers([], logger)
    fold = "" if config.fold is None else f"/fold-{config.fold}"
    run = RunInfo(
        log_dir=config.log_dir,
        experiment_dir=config.experiment_log_dir,
        config=config.config,
        experiment=config["name"],
        run_name=config.run_id + fold,
        epochs_done=trainer.state.epoch,
        batches_done=trainer.state.batches,
        start_step=trainer.state.global_step,
        resumed_ids=resumed_ids(trainer.resumed_logger_runs, config.log_dir, logger),
    )
    opened = []
    for name in selected_loggers(config["trainer"]):
        try:
            opened.append(open_logger(name, run, config["trainer"]))
        except Exception as error:  # a logger's failure, not the run's
            logger.warning(
                "Logger %s could not start (%s): the run goes on without it.",
                name,
                describe_error(error),
            )
    loggers = Loggers(opened, logger)
    # A tracker that could not start this time keeps its run for the next resume.
    loggers.run_ids = {**run.resumed_ids, **loggers.run_ids}
    if loggers.run_ids:  # the folder that sends to these runs, and marks what it sent
        loggers.run_ids[LOG_DIR_KEY] = str(config.log_dir.resolve())
    return loggers


def resumed_ids(saved: dict[str, str], log_dir: Path, logger: logging.Logger) -> dict[str, str]:
    """The tracking runs a resume continues: the checkpoint's, unless they were sent to from
    another log folder (a copied or moved run folder). The copy would write into the original's
    tracking runs, and its log folder has no record of what they hold (.<name>-sent.json), so it
    starts new ones. Checkpoints from before LOG_DIR_KEY continue theirs."""
    ids = {name: run_id for name, run_id in saved.items() if name != LOG_DIR_KEY}
    own = str(log_dir.resolve())
    if ids and saved.get(LOG_DIR_KEY, own) != own:
        logger.warning(
            "The checkpoint's %s runs were logged from %s, not this run's log folder (a copied "
            "or moved run folder): new ones start here.",
            " and ".join(sorted(ids)),
            saved[LOG_DIR_KEY],
        )
        return {}
    return ids

"""Experiment trackers: Weights & Biases and MLflow, optional packages imported only when their
logger is opened (requirements-extras.txt installs them). A resumed run continues its tracking
run: the id is kept in the checkpoint (ExperimentLogger.run_id, RunInfo.resumed_ids)."""

import json
import time
from pathlib import Path

import torch

from logger.experiment_logger import RunInfo, ScalarLogger, image_pixels
from utils.state.checkpoint import write_text_atomic
from utils.util import json_text

MAX_PARAMS_PER_CALL = 100  # MLflow's log_batch takes at most this many parameters
MAX_PARAM_LENGTH = 500  # characters of a parameter value every MLflow version stores


class SentSteps:
    """What was last sent to a tracking run, in <log_dir>/.<name>-sent.json: the (global step,
    epoch, batch) of the last log_step row (steps only grow; under gradient accumulation rows of
    one step differ in batch, and in epoch where an epoch's first rows precede its first optimizer
    step) and the last epoch's row. A resume sends only what comes after
    them: what a part of the run cut short had sent after its checkpoint stands (for an exact
    resume, the same values), and nothing reaches the run twice. Each mark is written before
    what it marks is sent."""

    def __init__(self, log_dir: Path, name: str, run_id: str) -> None:
        self.path, self.run_id = log_dir / f".{name}-sent.json", run_id
        try:
            mark = json.loads(self.path.read_text(encoding="utf-8"))
            assert mark["run"] == run_id
            self.row, self.epoch = tuple(map(int, mark["row"])), int(mark["epoch"])
        except (OSError, ValueError, KeyError, TypeError, AssertionError):  # none, or another run's
            self.row, self.epoch = (-1, 0, 0), 0

    def take_batch(self, step: int, epoch: int, batch: int) -> bool:
        """Whether the log_step row at `step`, after `batch` batches of `epoch`, is new; marks
        it sent."""
        if (step, epoch, batch) <= self.row:
            return False
        self.row = (step, epoch, batch)
        self.save()
        return True

    def take_epoch(self, epoch: int) -> bool:
        """Whether the row of `epoch` is new; marks it sent."""
        if epoch <= self.epoch:
            return False
        self.epoch = epoch
        self.save()
        return True

    def save(self) -> None:
        mark = {"run": self.run_id, "row": list(self.row), "epoch": self.epoch}
        write_text_atomic(self.path, json_text(mark, indent=None), durable=False)


class TrackingLogger(ScalarLogger):
    """A tracker that keeps a run across resumes (W&B, MLflow): each row sent once."""

    sent: SentSteps

    def log_step(self, values: dict[str, float], *, step: int, epoch: int, batch: int) -> None:
        if self.sent.take_batch(step, epoch, batch):
            self.log_scalars(values, step)

    def log_epoch(self, metrics: dict[str, float], *, step: int, epoch: int) -> None:
        if self.sent.take_epoch(epoch):
            self.log_scalars({**metrics, "epoch": epoch}, step)


class WandbLogger(TrackingLogger):
    """A W&B run in <log_dir>/wandb/: synced as it goes online, kept there to `wandb sync`
    offline. The config is the run's config; every curve has the global step as its x-axis."""

    name = "wandb"
    takes_images = True

    def __init__(self, run: RunInfo, options: dict) -> None:
        import wandb

        self.wandb = wandb
        resumed_id = run.resumed_ids.get(self.name)
        self.run = wandb.init(
            project=options["wandb_project"] or run.experiment,
            name=run.run_name,
            id=resumed_id,
            resume="allow" if resumed_id else None,
            dir=run.log_dir,
            config=run.config,
            mode=options["wandb_mode"],  # None: WANDB_MODE, else online
            # The console stays ours (tqdm, info.log); W&B would otherwise wrap stdout.
            settings=wandb.Settings(console="off"),
        )
        # W&B's own step must only grow; a run resumed from an earlier checkpoint logs steps
        # again, so the global step is a value of each row and the x-axis of every curve.
        self.run.define_metric("*", step_metric="global_step")
        self.sent = SentSteps(run.log_dir, self.name, self.run.id)

    def log_scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log({**values, "global_step": step})

    def log_image(self, tag: str, image: torch.Tensor, step: int) -> None:
        self.run.log({tag: self.wandb.Image(image_pixels(image)), "global_step": step})

    def run_id(self) -> str | None:
        return self.run.id

    def close(self, *, finished: bool) -> None:
        self.run.finish(exit_code=0 if finished else 1)


def default_tracking_uri(experiment_dir: Path) -> str:
    """A SQLite file shared by the experiment's runs: saved/log/<name>/mlflow.db."""
    return f"sqlite:///{(experiment_dir / 'mlflow.db').resolve()}"


def tracking_uri(options: dict, experiment_dir: Path) -> str:
    return options["mlflow_tracking_uri"] or default_tracking_uri(experiment_dir)


def flat_params(config: dict, prefix: str = "") -> dict[str, str]:
    """{"trainer.epochs": "3", "metrics": '["accuracy"]', ...}: MLflow's parameters are flat
    strings. Values longer than MAX_PARAM_LENGTH are cut (config.json, logged whole as an
    artifact, keeps them)."""
    params = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            params.update(flat_params(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            params[name] = text[:MAX_PARAM_LENGTH]
    return params


class MlflowLogger(TrackingLogger):
    """An MLflow run in the experiment named after the config, at trainer.mlflow_tracking_uri
    (default: a SQLite file beside the runs' log folders, its artifacts in mlflow-artifacts/)."""

    name = "mlflow"
    takes_images = True

    def __init__(self, run: RunInfo, options: dict) -> None:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self.metric_type = Metric
        self.client = MlflowClient(tracking_uri=tracking_uri(options, run.experiment_dir))
        resumed_id = run.resumed_ids.get(self.name)
        if resumed_id:
            # Its parameters are those it started with: MLflow refuses to change one.
            self.id = resumed_id
            self.client.update_run(resumed_id, status="RUNNING")
            self.sent = SentSteps(run.log_dir, self.name, self.id)
            return
        experiment = self.client.get_experiment_by_name(run.experiment)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            # With the default store, artifacts go beside it, not into ./mlruns of the
            # working directory.
            artifacts = run.experiment_dir / "mlflow-artifacts"
            location = None if options["mlflow_tracking_uri"] else artifacts.resolve().as_uri()
            experiment_id = self.client.create_experiment(run.experiment, location)
        self.id = self.client.create_run(experiment_id, run_name=run.run_name).info.run_id
        params = [Param(key, value) for key, value in flat_params(run.config).items()]
        for start in range(0, len(params), MAX_PARAMS_PER_CALL):
            self.client.log_batch(self.id, params=params[start : start + MAX_PARAMS_PER_CALL])
        self.client.log_dict(self.id, run.config, "config.json")
        self.sent = SentSteps(run.log_dir, self.name, self.id)

    def log_scalars(self, values: dict[str, float], step: int) -> None:
        timestamp = int(time.time() * 1000)
        metrics = [self.metric_type(key, value, timestamp, step) for key, value in values.items()]
        self.client.log_batch(self.id, metrics=metrics)

    def log_image(self, tag: str, image: torch.Tensor, step: int) -> None:
        self.client.log_image(self.id, image_pixels(image), artifact_file=f"{tag}-step{step}.png")

    def run_id(self) -> str | None:
        return self.id

    def close(self, *, finished: bool) -> None:
        self.client.set_terminated(self.id, "FINISHED" if finished else "KILLED")

"""The engine: runs a task's training_step and validation_step (trainer/trainer.py) over epochs.

Written once so that no task has to: gradient accumulation and DDP's no_sync, autocast and
GradScaler, clipping, the learning-rate schedule, weight averages, non-finite losses, exact
metric sums, the log_step reads, the progress bar, the loggers, stop signals, checkpoints and
resume."""

import abc
import functools
import logging
import signal
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.contrib.logging import logging_redirect_tqdm

from base.base_data_loader import BaseDataLoader
from base.checks import check_first_batch
from base.evaluation import evaluate, validate
from base.intervals import Progress, epoch_speed, log_epoch_line, log_interval, skip_step
from base.profiling import profiled, profiling
from logger import Loggers, check_logger_packages, open_loggers
from utils import amp_dtype, derive_seed, seed_everything, unwrap_model
from utils.data.batches import (
    all_finite,
    batch_geometry,
    check_loaders,
    epoch_batches,
    lr_scale,
    to_device,
)
from utils.distributed.process_group import all_reduce_max, is_distributed, world_size
from utils.distributed.sharding import gradient_sync
from utils.evaluation.confusion import ConfusionMatrix
from utils.evaluation.metric_sums import MetricFn, MetricSums, StepOutput
from utils.evaluation.monitor import Monitor
from utils.optim.averaging import new_average, update_if_due
from utils.optim.group_epochs import drop_finished_gradients, epoch_limits
from utils.optim.lookahead import new_lookahead
from utils.optim.schedule import build_scheduler, schedule_signature, step_scheduler, warmup_steps
from utils.state.resume import epoch_start, epoch_start_lr, restore, restore_rng
from utils.state.signals import StopRequest
from utils.state.timeline import ResumePoint
from utils.state.training_state import TrainingState, save_epoch_end, save_inside_epoch
from utils.timing import DataWait, Stopwatch
from utils.util import Interrupted, StopInEpoch


class BaseTrainer(abc.ABC):
    """Trains `model` on `data` for epochs start_epoch..epochs, checkpointing as it goes."""

    def __init__(
        self,
        model: nn.Module,
        criterion: Any,
        metric_fns: dict[str, MetricFn],
        optimizer: torch.optim.Optimizer | None,
        *,
        config: Any,  # parse_config.ConfigParser
        device: torch.device,
        data: BaseDataLoader,
        logger: logging.Logger | None = None,
        rank: int = 0,
    ) -> None:
        self.model, self.criterion, self.metric_fns = model.to(device), criterion, metric_fns
        self.optimizer, self.lr_scheduler = optimizer, None
        self.ema, self.lookahead, self.epoch_limits = None, None, []
        self.config, self.device, self.data, self.rank = config, device, data, rank
        self.logger = logger or logging.getLogger("trainer")
        self.options = options = config["trainer"]
        self.epochs = options["epochs"]
        self.amp_dtype = amp_dtype(options["amp"])
        # fp16 gradients underflow without loss scaling; disabled, the scaler passes through.
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.amp_dtype == torch.float16)
        self.monitor = Monitor(
            config.monitor_mode, config.monitor_key, options["early_stop"], options["save_top_k"]
        )
        schedule = config["lr_scheduler"]
        self.step_per_batch = schedule is not None and schedule["interval"] == "step"
        self.train_loader, self.val_loader, self.len_epoch = None, None, 0
        self.state = TrainingState()  # where the run stands: epoch, step, position, timeline
        self.steps_per_epoch, self.warmup_steps, self.lr_scale = 0, 0, 1.0
        self.geometry, self.data_fingerprint, self.schedule_signature = {}, {}, None
        if optimizer is not None:  # without one, the trainer only evaluates (test.py)
            check_logger_packages(options, config.source)  # before anything is written
            # A compiled model keeps one graph for one batch shape: a short last batch would
            # make torch.compile recompile, so it is dropped instead.
            self.train_loader = data.train_loader(drop_last=options["compile"])
            self.val_loader = data.val_loader()
            check_loaders(
                self.train_loader, self.val_loader, self.monitor.key, options["len_epoch"]
            )
            # Iteration-based epochs: exactly len_epoch batches, across passes if need be; one
            # optimizer step per accumulation group, the last one maybe short.
            self.len_epoch = options["len_epoch"] or len(self.train_loader)
            self.steps_per_epoch = -(-self.len_epoch // options["grad_accum_steps"])
            self.lr_scale = lr_scale(config, world_size())
            self.lr_scheduler = build_scheduler(
                config, optimizer, self.steps_per_epoch, lr_scale=self.lr_scale, logger=self.logger
            )
            self.schedule_signature = schedule_signature(config, optimizer, self.steps_per_epoch)
            self.warmup_steps = warmup_steps(config, self.steps_per_epoch)
            # What a mid-epoch position and the learning rates are counted in; what a resume
            # checks it continues on (the data behind every split).
            self.geometry = batch_geometry(config, self.train_loader)
            self.data_fingerprint = data.fingerprint()
            self.ema = new_average(unwrap_model(self.model), options, self.steps_per_epoch)
            self.lookahead = new_lookahead(unwrap_model(self.model), options, self.steps_per_epoch)
            self.epoch_limits = epoch_limits(config, unwrap_model(self.model))  # train_epochs
        self.data_wait_seconds = 0.0  # of the last epoch, measured by train_epoch
        self.flops_per_sample: float | None = None  # of a training step, counted by base/checks.py
        self.profiler: torch.profiler.profile | None = None  # inside fit(), with trainer.profile
        self.checkpoint_dir = Path(config.checkpoint_dir)
        self.loggers = Loggers([], self.logger)  # opened by fit(), on rank 0
        self.resumed_logger_runs: dict[str, str] = {}  # W&B's and MLflow's run ids, to continue
        self.confusion: ConfusionMatrix | None = None  # of the last validation, for classifiers
        self.stop = StopRequest()
        # trainer.async_checkpoint: a background save to finish, and the group it syncs with.
        self.pending_save, self.checkpoint_group = None, None

    @property
    def start_epoch(self) -> int:
        """The epoch that training starts with: the one after the last one done."""
        return self.state.epoch + 1

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far: the x-axis of every logged curve."""
        return self.state.global_step

    @abc.abstractmethod
    def training_step(self, batch: Any) -> StepOutput:
        """The loss of one batch (already on the device, inside autocast) and what the metrics
        read; the engine does the backward pass and the optimizer step."""

    @abc.abstractmethod
    def validation_step(self, batch: Any) -> StepOutput:
        """The same for a validation batch, run in evaluation mode without gradients."""

    def on_train_start(self) -> None:  # noqa: B027 (an optional hook, not abstract)
        """Called once before the first epoch, after the loggers are open (data, sizes, images)."""

    def check_first_batch(self) -> None:
        """One training batch through training_step, before anything is written (base/checks.py)."""
        check_first_batch(self)

    def resume(self, point: ResumePoint | Path) -> None:
        """Start at a checkpoint (utils/state/resume.py decides what of it this run can take)."""
        if isinstance(point, Path):
            point = ResumePoint(point, self.state.timeline)
        restore(self, point)

    def fit(self) -> dict[str, float]:
        """Train until the last epoch or an early stop; return the last epoch's metrics.

        Raises Interrupted after saving a checkpoint when SIGTERM, SIGINT or SIGUSR1 arrives.
        """
        self.loggers = open_loggers(self)
        metrics: dict[str, float] = {}
        finished = False
        try:
            # Log lines go above the progress bar; trainer.profile's window, when it is set.
            with logging_redirect_tqdm(), self.stop, profiling(self):
                self.on_train_start()
                if self.start_epoch > self.epochs:
                    self.logger.info("All %d epochs are already done.", self.epochs)
                for epoch in range(self.start_epoch, self.epochs + 1):
                    metrics = self.run_epoch(epoch)
                    if self.monitor.should_stop:
                        key, patience = self.monitor.key, self.monitor.early_stop
                        self.logger.info(
                            f"Early stop: {key} did not improve for {patience} epochs."
                        )
                        break
            finished = True
        finally:
            self.loggers.close(finished=finished)
        return metrics

    def run_epoch(self, epoch: int) -> dict[str, float]:
        """Train, validate, log, step the schedule, save; stop if a signal asked to."""
        # Augmentation, dropout and data order become a function of (seed, epoch, rank): an
        # epoch replays the same way after a resume (a mid-epoch one then restores its RNG).
        seed_everything(derive_seed(self.config["seed"], epoch, self.rank))
        learning_rate = epoch_start_lr(self)  # what this epoch starts with, also after a resume
        start, stopwatch = time.perf_counter(), Stopwatch(self.device)
        stopwatch.start()
        try:
            metrics = self.train_epoch(epoch)
        except StopInEpoch as stop:
            path = save_inside_epoch(self, epoch, stop)  # the next run goes on from there
            raise Interrupted(self.stop.signum or signal.SIGTERM, path) from None
        train_seconds = stopwatch.stop()
        if epoch == self.epochs and self.lookahead is not None:  # also after a changed geometry
            self.lookahead.finish(unwrap_model(self.model))
        metrics.update(self.validate())
        metrics["time/epoch_seconds"] = time.perf_counter() - start
        epoch_speed(self, metrics, train_seconds)
        metrics["lr"] = learning_rate
        step_scheduler(self.lr_scheduler, metrics, self.monitor.key, self.step_per_batch)
        improved = self.monitor.update(metrics, epoch)
        in_top_k, dropped = self.monitor.rank_top_k(metrics, epoch)
        # One x-axis for every curve: the optimizer step.
        self.loggers.log_epoch(metrics, step=self.global_step, epoch=epoch)
        log_epoch_line(self, epoch, metrics, improved)
        # A signal that came during validation: every rank must agree to stop here. The agreed
        # value decides, not self.stop.signum: a signal that lands just after the agreement
        # reaches one rank first, which alone would then stop. It stays pending instead.
        agreed = int(all_reduce_max(torch.tensor(self.stop.signum or 0, device=self.device)))
        if self.confusion is not None and (epoch == self.epochs or self.monitor.should_stop):
            counts = self.confusion.all_ranks()  # the run's final validation; a collective
            if counts is not None:
                self.loggers.log_confusion_matrix(counts, self.data.class_names(), self.global_step)
        # The last epoch (also an early-stopped or interrupted one) is always saved.
        last = epoch == self.epochs or self.monitor.should_stop or bool(agreed)
        path = save_epoch_end(self, epoch, metrics, last=last, improved=improved,
                              in_top_k=in_top_k, dropped=dropped)  # fmt: skip
        if agreed and epoch < self.epochs:
            raise Interrupted(agreed, path)
        return metrics

    def train_epoch(self, epoch: int) -> dict[str, float]:
        """training_step over len_epoch batches, an optimizer step per accumulation group."""
        self.model.train()
        accumulate = self.options["grad_accum_steps"]
        # Where a mid-epoch checkpoint left off (else the epoch's start), in this run's batches;
        # the sums it saved are those of all ranks, which rank 0 adds back.
        begin = epoch_start(self)
        first_batch, last_step = begin.first_batch, begin.last_step
        skip_samples = begin.skip_samples
        sums = MetricSums(self.metric_fns, self.device, begin.sums if self.rank == 0 else None)
        progress = Progress(self, epoch, first_batch, last_step)  # a bar, or lines for a pipe
        data_wait, stop_signum = DataWait(), 0
        at_resume_point = functools.partial(restore_rng, self, epoch, first_batch)
        ordered = epoch_batches(
            self.train_loader, epoch, first_batch, self.len_epoch, at_resume_point, skip_samples
        )
        batches = profiled(self.profiler, data_wait.timed(ordered))
        for step, batch in enumerate(batches, start=first_batch + 1):
            batch = to_device(batch, self.device, self.options["channels_last"])
            # Gradients add up over a group of batches, then one optimizer step. Each loss is
            # divided by the group's size, so the step equals one on the big batch. Groups
            # count from where this part of the epoch began.
            group_start = first_batch + (step - first_batch - 1) // accumulate * accumulate
            group_size = min(accumulate, last_step - group_start)
            ends_group = step == group_start + group_size
            # DDP and FSDP reduce gradients in backward: only on the group's last batch.
            with gradient_sync(self.model, ends_group):
                with torch.autocast(self.device.type, self.amp_dtype, self.amp_dtype is not None):
                    result = self.training_step(batch)
                if self.options["nonfinite"] == "skip" and not all_finite(result.loss):
                    skip_step(self, epoch, step)  # its row, still due, is at the next step taken
                    ends_group = False
                else:
                    loss = result.loss if group_size == 1 else result.loss / group_size
                    self.scaler.scale(loss).backward()
                    sums.add(result, step)
            if ends_group:
                self.optimizer_step()
            if step % self.options["log_step"] == 0 or step == last_step:
                stop_signum = log_interval(self, epoch, step, sums, progress, ends_group)
            # Stop when asked, at a group's end: at once alone, under torchrun when ranks agreed.
            if not is_distributed():
                stop_signum = self.stop.signum or 0
            if stop_signum and ends_group and step < last_step:
                self.stop.signum = stop_signum
                progress.close()
                raise StopInEpoch(step, begin.samples_at(step), sums.state_dict())
        progress.close()
        self.data_wait_seconds = data_wait.seconds
        return sums.result("train")

    def optimizer_step(self) -> None:
        """Clip, step (skipped by GradScaler when fp16 gradients overflowed), schedule."""
        drop_finished_gradients(self)  # train_epochs: before clipping and GradScaler see them
        if self.options["grad_clip"] is not None:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not scaled ones
            nn.utils.clip_grad_norm_(self.model.parameters(), self.options["grad_clip"])
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.step_per_batch:
            self.lr_scheduler.step()
        self.state.global_step += 1
        step, model = self.state.global_step - self.state.step_offset, unwrap_model(self.model)
        if self.ema is not None:  # every ema_period steps
            update_if_due(self.ema, model, step, self.options, self.warmup_steps)
        if self.lookahead is not None:  # every lookahead_period steps
            self.lookahead.step(model, step, self.epochs * self.steps_per_epoch)

    def evaluate(self, loader: Any, prefix: str, observe: Any = None) -> dict[str, float]:
        """validation_step over every sample of `loader` exactly once (base/evaluation.py)."""
        return evaluate(self, loader, prefix, observe)

    def validate(self) -> dict[str, float]:
        """The epoch's validation, of the trained and the averaged weights (base/evaluation.py)."""
        return validate(self)

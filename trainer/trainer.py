"""The training step and the evaluation loop, in plain torch."""

import itertools
import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any

import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from base import BaseDataLoader, BaseTrainer
from base.base_data_loader import DataError
from base.base_trainer import StopInEpoch, TrainingError
from utils import unwrap_model
from utils.data_summary import log_data_summary
from utils.distributed import all_reduce_max, all_reduce_sum, is_distributed, sync_buffers
from utils.timing import DataWait

MetricFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Trainer(BaseTrainer):
    """Trains a classifier: loss and metrics accumulate on the device and are read once per
    log_step steps and once per epoch, so the loop never waits on the GPU in between."""

    def __init__(
        self,
        model: nn.Module,
        criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        metric_fns: dict[str, MetricFn],
        optimizer: torch.optim.Optimizer,
        *,
        config: Any,
        device: torch.device,
        data: BaseDataLoader,
        lr_scheduler: Any = None,
        logger: logging.Logger | None = None,
        rank: int = 0,
    ) -> None:
        super().__init__(
            model,
            optimizer,
            config=config,
            device=device,
            lr_scheduler=lr_scheduler,
            logger=logger,
            rank=rank,
        )
        self.criterion = criterion
        self.metric_fns = metric_fns
        self.data = data
        # Labels the model has no output for fail here, before any output is written.
        data.check(config["arch"]["args"].get("num_classes"))
        trainer_config = config["trainer"]
        # A compiled model keeps one graph for one batch shape: a short last batch would make
        # torch.compile recompile (and keep a second graph), so it is dropped instead.
        self.train_loader = data.train_loader(drop_last=trainer_config["compile"])
        self.val_loader = data.val_loader()
        # Decided on the global counts, alike on every rank: a rank whose share is empty (fewer
        # validation samples than ranks) still takes part in the collectives.
        if len(self.train_loader.sampler.indices) == 0:
            raise DataError("the training split is empty: nothing to train on")
        if self.val_loader is not None and len(self.val_loader.sampler.indices) == 0:
            raise DataError("the validation split is empty: lower validation_split or add data")
        if self.monitor.key.startswith("val/") and self.val_loader is None:
            raise DataError(
                f"trainer.monitor watches {self.monitor.key} but there is no validation data: "
                "set data_loader.args.validation_split or monitor a train/ metric"
            )
        # Iteration-based epochs: exactly len_epoch batches, across passes if need be.
        self.len_epoch = trainer_config["len_epoch"] or len(self.train_loader)
        self.log_step = trainer_config["log_step"]
        self.channels_last = trainer_config["channels_last"]
        self.grad_accum_steps = trainer_config["grad_accum_steps"]
        self.grad_clip = trainer_config["grad_clip"]
        self.nonfinite = trainer_config["nonfinite"]
        self.max_skipped_steps = trainer_config["max_skipped_steps"]
        self.step_scheduler_per_batch = (
            lr_scheduler is not None and config["lr_scheduler"]["interval"] == "step"
        )

    def on_train_start(self) -> None:
        model = unwrap_model(self.model)
        self.logger.info("%s", model)
        batch_size, num_processes = self.train_loader.batch_size, self.data.num_replicas
        self.logger.info(
            "Data: %d training samples, %d validation samples, %d classes; %d batches per epoch. "
            "Global batch %d = %d per process x %d process(es) x %d accumulated, on %s.",
            len(self.train_loader.sampler.indices),
            len(self.val_loader.sampler.indices) if self.val_loader is not None else 0,
            len(self.data.class_names()),
            self.len_epoch,
            batch_size * num_processes * self.grad_accum_steps,
            batch_size,
            num_processes,
            self.grad_accum_steps,
            self.device,
        )
        if self.rank == 0:  # the data of all ranks together: logged once
            log_data_summary(self.data, self.logger, self.start_epoch)
        self.logger.info("Outputs: %s and %s", self.checkpoint_dir, self.config.log_dir)
        if not self.writer.enabled:
            return
        # One grid of (de-normalised) training inputs, so a user can see what the model sees.
        # Augmenting them draws random numbers: fork the RNG so that a mid-epoch resume, which
        # restored the RNG state, continues exactly.
        dataset = self.train_loader.dataset
        with torch.random.fork_rng(devices=[]):
            images = torch.stack([dataset[index][0] for index in range(min(32, len(dataset)))])
        mean = torch.tensor(self.data.mean).view(1, -1, 1, 1)
        std = torch.tensor(self.data.std).view(1, -1, 1, 1)
        grid = torchvision.utils.make_grid((images * std + mean).clamp(0, 1), nrow=8)
        self.writer.add_image("train/inputs", grid, self.start_epoch)

    def train_epoch(self, epoch: int) -> dict[str, float]:
        self.model.train()
        # [loss sum, one sum per metric, sample count], accumulated on the device.
        totals = torch.zeros(len(self.metric_fns) + 2, dtype=torch.float64, device=self.device)
        first_batch = self.resume_batch  # > 0 when resuming inside this epoch
        if self.resume_totals is not None and self.rank == 0:
            totals += self.resume_totals.to(self.device)
        self.resume_batch, self.resume_totals = 0, None
        logged = totals.clone()
        # The first step of this epoch whose loss was not finite (0: none yet), kept on the device.
        first_nonfinite = torch.zeros((), dtype=torch.int64, device=self.device)
        start, num_samples, stop_signum = time.perf_counter(), 0, 0
        self.data_wait = DataWait()
        progress = tqdm(
            total=self.len_epoch,
            initial=first_batch,
            desc=f"epoch {epoch}/{self.epochs}",
            disable=self.verbosity == 0 or self.rank != 0 or not sys.stderr.isatty(),
            leave=False,
        )
        batches = self.data_wait.timed(self.epoch_batches(epoch, first_batch))
        for step, (images, targets) in enumerate(batches, start=first_batch + 1):
            images = images.to(self.device, non_blocking=True)  # (B, C, H, W)
            targets = targets.to(self.device, non_blocking=True)  # (B,)
            if self.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            # Gradients add up over an accumulation group of batches, then one optimizer step.
            # Each loss is divided by the group's size, so the step equals one on the big batch.
            group_start = (step - 1) // self.grad_accum_steps * self.grad_accum_steps
            group_size = min(self.grad_accum_steps, self.len_epoch - group_start)
            steps_optimizer = step == group_start + group_size
            # DDP all-reduces gradients in backward: only on the group's last batch.
            no_sync = getattr(self.model, "no_sync", None)
            with nullcontext() if steps_optimizer or no_sync is None else no_sync():
                with torch.autocast(
                    self.device.type, self.amp_dtype, enabled=self.amp_dtype is not None
                ):
                    output = self.model(images)  # (B, num_classes)
                    loss = self.criterion(output, targets)
                # "skip" must decide before stepping, so it reads the loss every step (a host
                # sync); under torchrun every rank skips when any rank's loss is not finite.
                if (
                    self.nonfinite == "skip"
                    and all_reduce_max((~torch.isfinite(loss)).int()).item()
                ):
                    self.skip_step(epoch, step)
                    continue
                scaled = loss if group_size == 1 else loss / group_size
                self.scaler.scale(scaled).backward()
            if steps_optimizer:
                if self.grad_clip is not None:
                    self.scaler.unscale_(self.optimizer)  # clip the true gradients, not scaled ones
                    nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.optimizer.zero_grad(set_to_none=True)
                if self.step_scheduler_per_batch:
                    self.lr_scheduler.step()
                self.global_step += 1
            num_samples += targets.shape[0]
            with torch.no_grad():
                totals += batch_sums(output.float(), targets, loss.float(), self.metric_fns)
                is_new_fault = ~torch.isfinite(loss) & (first_nonfinite == 0)
                first_nonfinite = torch.where(is_new_fault, step, first_nonfinite)

            if step % self.log_step == 0 or step == self.len_epoch:
                # The only host-device sync inside the loop: once every log_step steps. Under
                # torchrun the fault and stop flags are agreed on here, so that every rank stops
                # at the same step.
                flags = torch.stack(
                    [first_nonfinite, torch.full_like(first_nonfinite, self.stop.signum or 0)]
                )
                all_reduce_max(flags)
                *interval, first_fault, stop_signum = torch.cat(
                    [totals - logged, flags.double()]
                ).tolist()
                logged = totals.clone()
                if first_fault:
                    raise TrainingError(
                        f"non-finite loss at epoch {epoch}, step {int(first_fault)} "
                        '(trainer.nonfinite is "stop"); lower the learning rate, check the data, '
                        'or set trainer.nonfinite to "skip". Checkpoints saved so far are intact.'
                    )
                interval_loss = interval[0] / interval[-1]
                self.writer.add_scalar("train/step_loss", interval_loss, self.global_step)
                if self.step_scheduler_per_batch:
                    lr = self.optimizer.param_groups[0]["lr"]
                    self.writer.add_scalar("train/lr", lr, self.global_step)
                progress.set_postfix(
                    loss=f"{interval_loss:.4f}",
                    samples_per_s=f"{num_samples / (time.perf_counter() - start):.0f}",
                )
                progress.update(step - progress.n)
            # Stop after this step when asked (at the end of an accumulation group): at once in
            # a single process; under torchrun at the interval where the ranks agreed on it.
            if not is_distributed():
                stop_signum = self.stop.signum or 0
            if stop_signum and steps_optimizer and step < self.len_epoch:
                self.stop.signum = int(stop_signum)
                progress.close()
                # The checkpoint keeps the sums over all ranks; rank 0 alone adds them back.
                raise StopInEpoch(step, all_reduce_sum(totals.clone()))
        progress.close()
        metrics = to_metrics(all_reduce_sum(totals), self.metric_fns, "train")
        metrics["time/data_wait_seconds"] = self.data_wait.seconds
        return metrics

    def skip_step(self, epoch: int, step: int) -> None:
        """Drop a batch whose loss is not finite, with the gradients its accumulation group
        gathered so far; give up after max_skipped_steps of them."""
        self.optimizer.zero_grad(set_to_none=True)
        self.num_skipped_steps += 1
        self.logger.warning(
            "Skipped step %d of epoch %d: non-finite loss (%d skipped so far).",
            step,
            epoch,
            self.num_skipped_steps,
        )
        if self.num_skipped_steps > self.max_skipped_steps:
            raise TrainingError(
                f"more than trainer.max_skipped_steps ({self.max_skipped_steps}) steps had a "
                f"non-finite loss (last: epoch {epoch}, step {step}); lower the learning rate "
                "or check the data"
            )

    def validate(self) -> dict[str, float]:
        if self.val_loader is None:
            return {}
        # The plain module, with rank 0's BatchNorm statistics on every rank: a DDP forward could
        # sync buffers, which hangs when ranks hold different numbers of validation batches.
        model = unwrap_model(self.model)
        sync_buffers(model)
        metrics, _ = evaluate(
            model, self.val_loader, self.criterion, self.metric_fns, self.device,
            prefix="val", amp_dtype=self.amp_dtype, channels_last=self.channels_last,
        )  # fmt: skip
        del metrics["val/num_samples"]  # the same every epoch: logged once at the start
        return metrics

    def epoch_batches(
        self, epoch: int, first_batch: int = 0
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches first_batch+1 .. len_epoch of this epoch. A new pass, in its own
        (seed, epoch, pass) order, starts when the loader runs out."""
        batches_per_pass = len(self.train_loader)
        pass_index, offset = divmod(first_batch, batches_per_pass)
        remaining = self.len_epoch - first_batch
        while remaining > 0:
            # Skip `offset` batches by skipping their indices: no data is loaded for them.
            self.train_loader.sampler.set_epoch(
                epoch, pass_index, start=offset * self.train_loader.batch_size
            )
            taken = min(remaining, batches_per_pass - offset)
            yield from itertools.islice(self.train_loader, taken)
            remaining -= taken
            pass_index, offset = pass_index + 1, 0


def batch_sums(
    output: torch.Tensor, targets: torch.Tensor, loss: torch.Tensor, metric_fns: dict[str, MetricFn]
) -> torch.Tensor:
    """[loss * batch size, each metric's sum, batch size] for one batch, on the batch's device."""
    # torch.full fills on the device; new_tensor would copy a host scalar over and, on CUDA,
    # wait for the queued kernels: a host-device sync on every step.
    batch_size = torch.full((), targets.shape[0], dtype=torch.float64, device=targets.device)
    sums = [loss.detach().double() * batch_size]
    sums += [metric_fn(output, targets).double() for metric_fn in metric_fns.values()]
    return torch.stack([*sums, batch_size])


def to_metrics(
    totals: torch.Tensor, metric_fns: dict[str, MetricFn], prefix: str
) -> dict[str, float]:
    """Turn summed [loss, metrics..., count] into sample-weighted means: {"<prefix>/loss": ...}."""
    values = totals.tolist()
    num_samples = values[-1]
    metrics = {f"{prefix}/loss": values[0] / num_samples}
    for name, value in zip(metric_fns, values[1:-1], strict=True):
        metrics[f"{prefix}/{name}"] = value / num_samples
    metrics[f"{prefix}/num_samples"] = num_samples
    return metrics


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: DataLoader,
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    metric_fns: dict[str, MetricFn],
    device: torch.device,
    *,
    prefix: str,
    num_classes: int | None = None,
    amp_dtype: torch.dtype | None = None,
    channels_last: bool = False,
) -> tuple[dict[str, float], torch.Tensor | None]:
    """Loss and metrics over every sample of `loader` exactly once (summed over ranks).

    Also returns per-class [correct, total] counts, shape (2, num_classes), when num_classes is given.
    """
    model.eval()
    totals = torch.zeros(len(metric_fns) + 2, dtype=torch.float64, device=device)
    per_class = (
        torch.zeros(2, num_classes, dtype=torch.int64, device=device) if num_classes else None
    )
    for images, targets in loader:
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, amp_dtype, enabled=amp_dtype is not None):
            output = model(images)
            loss = criterion(output, targets)
        output = output.float()
        totals += batch_sums(output, targets, loss.float(), metric_fns)
        if per_class is not None:
            correct = output.argmax(dim=1) == targets
            per_class[0] += torch.bincount(targets[correct], minlength=num_classes)
            per_class[1] += torch.bincount(targets, minlength=num_classes)
    all_reduce_sum(totals)
    if per_class is not None:
        all_reduce_sum(per_class)
    return to_metrics(totals, metric_fns, prefix), per_class

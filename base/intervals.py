"""The training loop's checks between steps: every log_step batches, its one host-device sync
(the running loss for the loggers and the progress, the non-finite and stop flags agreed by
every rank); with trainer.nonfinite "skip", dropping a batch whose loss is not finite; and the
progress, a bar on a terminal or a short line now and then in a pipe. BaseTrainer's
train_epoch uses all three."""

import math
import sys
import time
from typing import TYPE_CHECKING

from tqdm import tqdm

from utils.distributed.process_group import world_size
from utils.evaluation.metric_sums import MetricSums
from utils.timing import peak_flops, precision
from utils.util import TrainingError

if TYPE_CHECKING:
    from base.base_trainer import BaseTrainer


class Progress:
    """The epoch's progress on rank 0: a tqdm bar on a terminal; without one (a pipe, a cluster's
    log, CI) a line every trainer.progress_seconds at a log_step read, with the step, the
    running loss and the samples per second since the last line. Nothing at verbosity 0."""

    def __init__(
        self, trainer: "BaseTrainer", epoch: int, first_batch: int, last_step: int
    ) -> None:
        shown = trainer.options["verbosity"] > 0 and trainer.rank == 0
        self.bar = shown and sys.stderr.isatty()
        self.every = trainer.options["progress_seconds"] if shown and not self.bar else None
        self.trainer, self.epoch, self.last_step = trainer, epoch, last_step
        self.tqdm = tqdm(total=last_step, initial=first_batch, disable=not self.bar, leave=False)
        self.tqdm.set_description(f"epoch {epoch}/{trainer.epochs}")
        # Samples are the epoch's MetricSums.num_added, which counts from 0 in this part.
        self.since, self.samples_at = time.perf_counter(), 0
        self.read_at, self.read_samples = self.since, 0  # the last log_step read

    def update(self, step: int, loss: float, num_added: int) -> None:
        self.tqdm.set_postfix(loss=f"{loss:.4f}")
        self.tqdm.update(step - self.tqdm.n)
        now = time.perf_counter()
        if self.every is None or now - self.since < self.every or step == self.last_step:
            return
        samples = (num_added - self.samples_at) * self.trainer.data.num_replicas
        self.trainer.logger.info(
            "epoch %d/%d  batch %d/%d  loss %.4g  %.4g samples/s",
            self.epoch, self.trainer.epochs, step, self.last_step, loss, samples / (now - self.since),
        )  # fmt: skip
        self.since, self.samples_at = now, num_added

    def close(self) -> None:
        self.tqdm.close()


def log_interval(
    trainer: "BaseTrainer",
    epoch: int,
    step: int,
    sums: MetricSums,
    progress: Progress,
    ends_group: bool = True,
) -> int:
    """The one host-device sync of the loop, every log_step steps: the running loss, and
    the fault and stop flags agreed by every rank. Returns the agreed stop signal (0: none).
    ends_group: whether this batch ended its accumulation group (made an optimizer step)."""
    interval, first_fault, stop_signum = sums.read_interval(trainer.stop.signum or 0)
    if first_fault:
        raise TrainingError(
            f"non-finite loss at epoch {epoch}, step {first_fault} "
            '(trainer.nonfinite is "stop"); lower the learning rate, check the data, '
            'or set trainer.nonfinite to "skip". Checkpoints saved so far are intact.'
        )
    # NaN where trainer.nonfinite "skip" dropped every batch since the last read: the row is
    # still logged, so the rows depend on the steps alone.
    interval_loss = interval[0] / interval[-1] if interval[-1] else math.nan
    values = {"train/step_loss": interval_loss}
    if trainer.step_per_batch:
        values["train/lr"] = trainer.optimizer.param_groups[0]["lr"]
    if trainer.flops_per_sample:  # since the last read (its sync ended the batches before it)
        # The batches' own sizes, not batch_size: a pass's last batch may be short.
        now, num_added = time.perf_counter(), sums.num_added
        samples = (num_added - progress.read_samples) * trainer.data.num_replicas
        values["time/step_flops_per_second"] = (
            trainer.flops_per_sample * samples / (now - progress.read_at)
        )
        progress.read_at, progress.read_samples = now, num_added
    # A read inside an accumulation group is logged at the step the group makes, not the one
    # before: a checkpoint (at a group's end, step S) then precedes every row at S + 1 on, which
    # TensorBoard's purge_step of a resume hides from the part cut short, so no row shows twice.
    at_step = trainer.global_step + (not ends_group)
    trainer.loggers.log_step(values, step=at_step, epoch=epoch, batch=step)
    progress.update(step, interval_loss, sums.num_added)
    return stop_signum


def skip_step(trainer: "BaseTrainer", epoch: int, step: int) -> None:
    """Drop a batch whose loss is not finite, with the gradients its accumulation group
    gathered so far; give up after max_skipped_steps of them."""
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.state.num_skipped_steps += 1
    count, limit = trainer.state.num_skipped_steps, trainer.options["max_skipped_steps"]
    trainer.logger.warning(
        f"Skipped step {step} of epoch {epoch}: non-finite loss ({count} skipped so far)."
    )
    if count > limit:
        raise TrainingError(
            f"more than trainer.max_skipped_steps ({limit}) steps had a non-finite loss "
            f"(last: epoch {epoch}, step {step}); lower the learning rate or check the data"
        )


def epoch_speed(trainer: "BaseTrainer", metrics: dict[str, float], train_seconds: float) -> None:
    """The epoch's time/ metrics: samples per second (of all ranks), the share of the time spent
    waiting for data, and with the FLOPs per sample counted (base/checks.py) the FLOP/s achieved
    and the model FLOP utilisation against the devices' peak, where it is known."""
    # After a mid-epoch resume train_seconds is this part's: so are the samples it counts.
    trained = metrics.pop("train/num_samples") - metrics.pop("train/num_resumed_samples", 0.0)
    rate = trained / train_seconds
    metrics["time/train_samples_per_second"] = rate
    # Near 1, the input pipeline is the bottleneck (more num_workers, faster transforms).
    metrics["time/data_wait_fraction"] = trainer.data_wait_seconds / train_seconds
    if trainer.flops_per_sample:
        metrics["time/flops_per_second"] = achieved = trainer.flops_per_sample * rate
        peak = peak_flops(trainer.device, precision(trainer.options))
        if peak is not None:
            metrics["time/mfu"] = achieved / (peak * world_size())


def log_epoch_line(
    trainer: "BaseTrainer", epoch: int, metrics: dict[str, float], improved: bool
) -> None:
    """epoch 3/10  train/loss 0.52 ... val/accuracy 0.81  (12.1 s, 4120 samples/s, 1.2
    TFLOP/s, MFU 35 %, lr 0.01)  *best*"""
    # Not the timings, nor the metrics' breakdowns (val/iou/<class>): those go to the loggers.
    shown = {
        key: value
        for key, value in metrics.items()
        if not key.startswith("time/") and key.count("/") < 2
    }
    summary = "  ".join(f"{key} {value:.4g}" for key, value in shown.items() if key != "lr")
    timing = [f"{metrics['time/epoch_seconds']:.1f} s",
              f"{metrics['time/train_samples_per_second']:.4g} samples/s"]  # fmt: skip
    if "time/flops_per_second" in metrics:
        achieved = metrics["time/flops_per_second"]
        scale, unit = (1e12, "TFLOP/s") if achieved >= 1e12 else (1e9, "GFLOP/s")
        timing.append(f"{achieved / scale:.3g} {unit}")
    if "time/mfu" in metrics:
        timing.append(f"MFU {100 * metrics['time/mfu']:.3g} %")
    timing.append(f"lr {metrics['lr']:.4g}")
    best = "  *best*" if improved else ""
    trainer.logger.info(
        "epoch %d/%d  %s  (%s)%s", epoch, trainer.epochs, summary, ", ".join(timing), best
    )

"""The training loop's two checks between steps: every log_step batches, its one host-device
sync (the running loss for the loggers, the non-finite and stop flags agreed by every rank);
and with trainer.nonfinite "skip", dropping a batch whose loss is not finite. BaseTrainer's
train_epoch calls both."""

from typing import TYPE_CHECKING

from tqdm import tqdm

from utils.evaluation.metric_sums import MetricSums
from utils.util import TrainingError

if TYPE_CHECKING:
    from base.base_trainer import BaseTrainer


def log_interval(
    trainer: "BaseTrainer", epoch: int, step: int, sums: MetricSums, progress: tqdm
) -> int:
    """The one host-device sync of the loop, every log_step steps: the running loss, and
    the fault and stop flags agreed by every rank. Returns the agreed stop signal (0: none)."""
    interval, first_fault, stop_signum = sums.read_interval(trainer.stop.signum or 0)
    if first_fault:
        raise TrainingError(
            f"non-finite loss at epoch {epoch}, step {first_fault} "
            '(trainer.nonfinite is "stop"); lower the learning rate, check the data, '
            'or set trainer.nonfinite to "skip". Checkpoints saved so far are intact.'
        )
    interval_loss = interval[0] / interval[-1]
    values = {"train/step_loss": interval_loss}
    if trainer.step_per_batch:
        values["train/lr"] = trainer.optimizer.param_groups[0]["lr"]
    trainer.loggers.log_step(values, step=trainer.global_step, epoch=epoch, batch=step)
    progress.set_postfix(loss=f"{interval_loss:.4f}")
    progress.update(step - progress.n)
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

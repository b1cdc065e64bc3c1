"""optimizer.param_groups[i].train_epochs: a group whose parameters train during epochs 1..N
only and stay exactly as they are from epoch N + 1 on, as the CIFAR-10 speed record (airbench94)
trains its whitening layer's bias for its first 3 epochs.

From epoch N + 1 the engine sets their gradients to None before every optimizer step, after the
backward pass (and DDP's all-reduce in it). torch's optimizers skip a parameter without a
gradient entirely: no step, no momentum, no weight decay, no step count (SGD's and Adam's
_init_group collect only parameters whose grad is not None, fused and foreach kernels alike). As
it comes before clipping and GradScaler's unscaling, neither the clipped norm nor the inf check
sees them: the run behaves as if they did not require gradients, which is how the record stops
them; changing requires_grad itself would make DDP's buckets and torch.compile's graph go stale.
The epoch alone decides (Python ints, no host-device sync), so a resumed run drops exactly what
an uninterrupted one does. Lookahead (trainer.lookahead_period) is not an optimizer step: it
still moves them once, to its slow weights at its first synchronisation after epoch N, as in
the record, and they stay fixed from then on."""

from typing import TYPE_CHECKING

from torch import nn

from parse_config import ConfigParser
from utils.optim.optimizer import parameter_groups

if TYPE_CHECKING:
    from base.base_trainer import BaseTrainer


def epoch_limits(config: ConfigParser, model: nn.Module) -> list[tuple[int, list[nn.Parameter]]]:
    """(N, the group's parameters) of each optimizer.param_groups entry with train_epochs N: the
    very parameters build_optimizer put in its group (`model` is the unwrapped model)."""
    entries = config["optimizer"].get("param_groups") or []
    groups = parameter_groups(model, entries, config.source)
    return [(group["train_epochs"], group["params"]) for group in groups if "train_epochs" in group]


def drop_finished_gradients(trainer: "BaseTrainer") -> None:
    """Set to None the gradients of the groups whose train_epochs are over: those that end before
    the epoch being trained, trainer.state.epoch + 1 (state.epoch counts the epochs done; it
    becomes the current one only at the epoch's end, also in a run resumed inside an epoch)."""
    epoch = trainer.state.epoch + 1
    for last_epoch, params in trainer.epoch_limits:
        if epoch > last_epoch:
            for param in params:
                param.grad = None

"""The learning-rate range test through the engine (tune.py --lr): the trainer's own
training_step, accumulation, autocast and GradScaler, clipping and gradient synchronisation
(DDP, FSDP), at learning rates set step by step. Everything it changes is put back: the
model, the optimizer, the GradScaler and the random number generators are those of a fresh
run afterwards."""

import copy
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from utils.data.batches import epoch_batches, to_device
from utils.distributed.process_group import all_reduce_sum, world_size
from utils.distributed.sharding import gradient_sync
from utils.optim.lr_range import RangeTest, run_range_test
from utils.util import get_rng_state, set_rng_state

if TYPE_CHECKING:
    from base.base_trainer import BaseTrainer


def lr_range_test(trainer: "BaseTrainer", lrs: list[float]) -> RangeTest:
    """Train one optimizer step per learning rate of `lrs` (each group keeps its ratio to the
    first group's rate) until the loss diverges; then restore the trainer's state."""
    saved = {
        "model": copy.deepcopy(trainer.model.state_dict()),
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
        "scaler": copy.deepcopy(trainer.scaler.state_dict()),
        "rng": get_rng_state(trainer.device),
    }
    try:
        return run_range_test(engine_step(trainer, len(lrs)), lrs)
    finally:
        trainer.model.load_state_dict(saved["model"])
        trainer.optimizer.load_state_dict(saved["optimizer"])
        trainer.scaler.load_state_dict(saved["scaler"])
        set_rng_state(saved["rng"], trainer.device)
        trainer.optimizer.zero_grad(set_to_none=True)


def engine_step(trainer: "BaseTrainer", num_steps: int) -> Callable[[float], float]:
    """step(lr): one optimizer step (an accumulation group of batches) at `lr`; the loss of
    its batches, averaged over them and over the ranks (a host sync: this is a tuning tool)."""
    accumulate = trainer.options["grad_accum_steps"]
    batches = epoch_batches(
        trainer.train_loader, 1, 0, num_steps * accumulate, lambda: None
    )  # epoch 1's order, across passes if need be
    ratios = [group["lr"] / trainer.optimizer.param_groups[0]["lr"] for group in
              trainer.optimizer.param_groups]  # fmt: skip
    trainer.model.train()

    def step(lr: float) -> float:
        for group, ratio in zip(trainer.optimizer.param_groups, ratios, strict=True):
            group["lr"] = lr * ratio
        total = torch.zeros((), device=trainer.device)
        for index, batch in enumerate(itertools.islice(batches, accumulate)):
            batch = to_device(batch, trainer.device, trainer.options["channels_last"])
            with gradient_sync(trainer.model, index == accumulate - 1):
                with torch.autocast(
                    trainer.device.type, trainer.amp_dtype, trainer.amp_dtype is not None
                ):
                    loss = trainer.training_step(batch).loss
                trainer.scaler.scale(loss / accumulate).backward()
            total += loss.detach().float() / accumulate
        if trainer.options["grad_clip"] is not None:
            trainer.scaler.unscale_(trainer.optimizer)
            nn.utils.clip_grad_norm_(trainer.model.parameters(), trainer.options["grad_clip"])
        trainer.scaler.step(trainer.optimizer)
        trainer.scaler.update()
        trainer.optimizer.zero_grad(set_to_none=True)
        return float(all_reduce_sum(total)) / world_size()

    return step

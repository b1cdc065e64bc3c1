"""The exponential moving average of the weights (trainer.ema_decay), updated without a host
sync: torch's AveragedModel keeps the state (its state dict is the checkpoint's "ema"), and
update_average does what its update_parameters does, without reading its update counter (a
CPU tensor, copied to the GPU at every update: a copy from pageable memory that waits for the
GPU's queue) or comparing it on the device."""

import logging
from collections import defaultdict

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


def new_average(model: nn.Module, options: dict, steps_per_epoch: int = 0) -> AveragedModel | None:
    """A copy of the plain model whose weights (and BatchNorm statistics) follow the trained
    ones: average = decay * average + (1 - decay) * weights, at each update; None when
    trainer.ema_decay is null. Warns when trainer.ema_period is longer than the run (epochs x
    steps_per_epoch): the average would stay the initial weights, validated and saved as such."""
    if options["ema_decay"] is None:
        return None
    num_steps = options["epochs"] * steps_per_epoch
    if options["ema_period"] > num_steps > 0:
        logging.getLogger("train").warning(
            "trainer.ema_period: %d optimizer steps, the run has %d: the average is never "
            "updated and stays the initial weights (val/ema_*, the checkpoints' ema); lower "
            "ema_period or train longer.",
            options["ema_period"], num_steps,
        )  # fmt: skip
    multi_avg_fn = get_ema_multi_avg_fn(options["ema_decay"])
    return AveragedModel(model, multi_avg_fn=multi_avg_fn, use_buffers=True)


@torch.no_grad()
def update_average(average: AveragedModel, model: nn.Module, *, restart: bool) -> None:
    """One update of `average` towards `model`'s weights and buffers; restart: copy them instead
    (its first update, or one that starts it afresh, e.g. after warmup)."""
    averaged = [*average.module.parameters(), *average.module.buffers()]
    current = [*model.parameters(), *model.buffers()]
    groups: dict[tuple, tuple[list, list]] = defaultdict(lambda: ([], []))
    for mine, theirs in zip(averaged, current, strict=True):
        theirs = theirs.detach().to(mine.device)
        if restart:
            mine.detach().copy_(theirs)
        else:  # the multi_avg_fn takes tensors of one device and dtype at a time
            group = groups[(mine.device, mine.dtype)]
            group[0].append(mine.detach())
            group[1].append(theirs)
    for mine, theirs in groups.values():
        average.multi_avg_fn(mine, theirs, average.n_averaged)
    if restart:
        average.n_averaged.zero_()
    average.n_averaged += 1  # where it is (the CPU): nothing crosses to or from the GPU


def update_if_due(
    average: AveragedModel, model: nn.Module, step: int, options: dict, warmup_steps: int
) -> None:
    """The update after optimizer step `step`, every trainer.ema_period steps. The first copies
    the weights; with trainer.ema_warmup_reset so does every update that follows one inside the
    warmup (torchvision's recipe): the average starts from the warmed-up weights. A function of
    the step: a resumed run does the same."""
    period = options["ema_period"]
    if step % period:
        return
    restart = step == period or (options["ema_warmup_reset"] and step - period <= warmup_steps)
    update_average(average, model, restart=restart)

"""Lookahead (trainer.lookahead_period; Zhang et al. 2019, "Lookahead Optimizer: k steps
forward, 1 step back"), which torch does not have: every k optimizer steps the slow weights move
part of the way to the trained ("fast") ones, and training goes on from the slow weights.

    share = decay * (step / total_steps) ** ramp      # what the slow weights keep
    slow  = share * slow + (1 - share) * fast;  fast = slow

ramp 0 is the paper's constant step; a ramp > 0 averages little early in the run and more at its
end (the CIFAR-10 speed records' cubic ramp). The run's last step is a synchronisation too, as
timm's sync_lookahead() is: the run ends on the slow weights, and the steps since the previous
synchronisation count in them (dropping them would end a run shorter than the period on its
initial weights).
BatchNorm's statistics are averaged with the weights. Python floats only: no host-device sync."""

import logging

import torch
from torch import nn


def floating_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's floating-point parameters and buffers, sharing its storage (not counters)."""
    return {name: value for name, value in model.state_dict().items() if value.is_floating_point()}


def new_lookahead(model: nn.Module, options: dict, steps_per_epoch: int = 0) -> "Lookahead | None":
    """trainer.lookahead_period's Lookahead of `model`'s weights, or None when it is off. Warns
    when the period is longer than the run (epochs x steps_per_epoch): the slow weights then move
    once, at the end, and the run ends mostly on its initial weights."""
    if options["lookahead_period"] is None:
        return None
    period, decay, ramp = (options[f"lookahead_{k}"] for k in ("period", "decay", "ramp"))
    num_steps = options["epochs"] * steps_per_epoch
    if period > num_steps > 0:
        logging.getLogger("train").warning(
            "trainer.lookahead_period: %d optimizer steps, the run has %d: the slow weights "
            "move once, at its end, keeping %g of its initial weights; lower lookahead_period "
            "or train longer.",
            period, num_steps, decay,
        )  # fmt: skip
    return Lookahead(model, period, decay, ramp)


class Lookahead:
    """The slow weights of one model (a copy of its floating-point state, on its device), and
    their update; the checkpoint's "lookahead" is state_dict()."""

    def __init__(self, model: nn.Module, period: int, decay: float, ramp: float) -> None:
        self.period, self.decay, self.ramp = period, decay, ramp
        self.slow = {name: value.clone() for name, value in floating_state(model).items()}

    @torch.no_grad()
    def step(self, model: nn.Module, step: int, total_steps: int) -> None:
        """After optimizer step `step` of the run's `total_steps`: a synchronisation every
        period, and one after the last step."""
        if step % self.period == 0:
            self.synchronise(model, self.decay * min(step / total_steps, 1.0) ** self.ramp)
        elif step == total_steps:
            self.finish(model)

    @torch.no_grad()
    def synchronise(self, model: nn.Module, share: float) -> None:
        """slow = share * slow + (1 - share) * fast, and the model goes on from slow."""
        for name, fast in floating_state(model).items():
            slow = self.slow[name]
            slow.lerp_(fast, 1.0 - share)
            fast.copy_(slow)

    @torch.no_grad()
    def finish(self, model: nn.Module) -> None:
        """The end of the run: a last synchronisation with the ramp's final share. Right after
        one the model already is the slow weights, and this changes nothing (lerp of equals)."""
        self.synchronise(model, self.decay)

    @torch.no_grad()
    def restart(self, model: nn.Module) -> None:
        """The slow weights become the model's (its weights were loaded from a checkpoint that
        has no lookahead state)."""
        for name, fast in floating_state(model).items():
            self.slow[name].copy_(fast)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.slow)

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, slow in self.slow.items():
            slow.copy_(state[name])

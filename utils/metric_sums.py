"""What a step returns, and the exact, sample-weighted sums the engine keeps of it."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from utils.distributed import all_reduce_max, all_reduce_sum

# A metric takes a step's output and target and returns the SUM of a per-sample score over the
# batch, as a 0-d tensor on the batch's device (model/metric.py).
MetricFn = Callable[[Any, Any], torch.Tensor]


@dataclass
class StepOutput:
    """What training_step and validation_step return.

    loss: the batch's mean loss, a 0-d tensor (the engine backpropagates it when training).
    output, target: what every configured metric is called with, metric(output, target).
    batch_size: the number of samples in the batch; by default len(target).
    """

    loss: torch.Tensor
    output: Any = None
    target: Any = None
    batch_size: int | None = None


class MetricSums:
    """[loss x batch size, each metric's sum, number of samples], summed on the device.

    Nothing here reads a value back to the host except read_interval and result, so adding a
    step never waits for the GPU. Dividing the sums by the number of samples at the end weighs
    every sample alike, however the batches were cut.
    """

    def __init__(
        self,
        metric_fns: dict[str, MetricFn],
        device: torch.device,
        initial: torch.Tensor | None = None,
    ) -> None:
        self.metric_fns = metric_fns
        self.totals = torch.zeros(len(metric_fns) + 2, dtype=torch.float64, device=device)
        if initial is not None:  # the sums a mid-epoch checkpoint saved
            self.totals += initial.to(device)
        self.logged = self.totals.clone()
        # The first step whose loss was not finite (0: none yet), kept on the device.
        self.first_nonfinite = torch.zeros((), dtype=torch.int64, device=device)

    @torch.no_grad()
    def add(self, step: StepOutput, index: int = 0) -> None:
        """Add a step's sums; `index` (> 0) numbers the step, for the non-finite check."""
        size = step.batch_size if step.batch_size is not None else len(step.target)
        # torch.full fills on the device; a host scalar copied over would wait for the GPU.
        batch_size = torch.full((), size, dtype=torch.float64, device=self.totals.device)
        sums = [step.loss.detach().double() * batch_size]
        sums += [fn(step.output, step.target).double() for fn in self.metric_fns.values()]
        self.totals += torch.stack([*sums, batch_size])
        is_new_fault = ~torch.isfinite(step.loss.detach()) & (self.first_nonfinite == 0)
        self.first_nonfinite = torch.where(is_new_fault, index, self.first_nonfinite)

    def read_interval(self, stop_signum: int) -> tuple[list[float], int, int]:
        """(the sums added since the last call, the first step with a non-finite loss, the stop
        signal), the last two the maximum over the ranks: one host-device sync in all."""
        flags = torch.stack(
            [self.first_nonfinite, torch.full_like(self.first_nonfinite, stop_signum)]
        )
        values = torch.cat([self.totals - self.logged, all_reduce_max(flags).double()]).tolist()
        self.logged = self.totals.clone()
        return values[:-2], int(values[-2]), int(values[-1])

    def all_ranks(self) -> torch.Tensor:
        """The sums over every rank (a collective), leaving this rank's own untouched."""
        return all_reduce_sum(self.totals.clone())

    def result(self, prefix: str) -> dict[str, float]:
        """{"<prefix>/loss": ..., "<prefix>/<metric>": ..., "<prefix>/num_samples": n} over every
        rank (a collective)."""
        return to_metrics(self.all_ranks(), list(self.metric_fns), prefix)


def to_metrics(totals: torch.Tensor, names: list[str], prefix: str) -> dict[str, float]:
    """Summed [loss, metrics..., count] as sample-weighted means."""
    values = totals.tolist()
    num_samples = values[-1]
    metrics = {f"{prefix}/loss": values[0] / num_samples}
    for name, value in zip(names, values[1:-1], strict=True):
        metrics[f"{prefix}/{name}"] = value / num_samples
    metrics[f"{prefix}/num_samples"] = num_samples
    return metrics

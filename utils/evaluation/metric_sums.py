"""What a step returns, and the exact, sample-weighted sums the engine keeps of it."""

import abc
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from utils.distributed.device import capabilities
from utils.distributed.process_group import all_reduce_max, all_reduce_sum
from utils.util import UserError

# A metric takes a step's output and target and returns the SUM of a per-sample score over the
# batch, as a 0-d tensor on the batch's device (model/metric.py); or it is a StatefulMetric, or
# an object with torchmetrics' update(output, target), compute() and reset().
MetricFn = Callable[[Any, Any], torch.Tensor]


def sum_dtype(device: torch.device) -> torch.dtype:
    """The dtype the metric sums are kept in on `device`: float64 where the device has it, else
    float32 (Apple's MPS), which MetricSums then compensates."""
    return torch.float64 if capabilities(device).float64 else torch.float32


class StatefulMetric(abc.ABC):
    """A metric that is not a mean of per-sample scores (RMSE, R², F1): `num_sums` sums that add
    up over batches and ranks, and its value computed from the epoch's totals. The engine keeps
    them with its own sums (on the device, float64, summed over the ranks, in a mid-epoch
    checkpoint), so the value is exact however the batches and the ranks were cut. Subclass it
    in model/metric.py; an instance holds no state, so one serves every epoch and split."""

    num_sums: int = 1

    @abc.abstractmethod
    def batch_sums(self, output: Any, target: Any) -> torch.Tensor:
        """This batch's sums: a 1-D tensor of num_sums values on the batch's device."""

    @abc.abstractmethod
    def compute(self, sums: list[float]) -> float:
        """The metric from the sums of every batch of every rank."""

    def breakdown(self, sums: list[float]) -> dict[str, float]:
        """Values beside the metric's own from the same sums, each logged as
        <split>/<metric>/<key> (MeanIoU's per class: val/iou/cat); by default none."""
        return {}


def num_slots(metric: Any) -> int:
    """How many of the engine's sums a metric takes: its num_sums (StatefulMetric), none for an
    object that keeps its own state (torchmetrics' Metric), else one (a per-sample sum)."""
    if isinstance(metric, StatefulMetric):
        return metric.num_sums
    return 0 if keeps_own_state(metric) else 1


def keeps_own_state(metric: Any) -> bool:
    """torchmetrics' Metric and the like: update(output, target), compute(), reset(); they sum
    themselves over the ranks in compute(). Their state is not in mid-epoch checkpoints."""
    return all(hasattr(metric, name) for name in ("update", "compute", "reset"))


@dataclass
class StepOutput:
    """What training_step and validation_step return.

    loss: the batch's mean loss, a 0-d tensor (the engine backpropagates it when training).
    output, target: what every configured metric is called with, metric(output, target).
    output None (default): a step with nothing for the metrics (e.g. a detector's training step,
    which makes losses and no detections); a pass of such steps has no metrics, only its loss.
    batch_size: the number of samples in the batch; by default len(target).
    """

    loss: torch.Tensor
    output: Any = None
    target: Any = None
    batch_size: int | None = None


class MetricSums:
    """[loss x batch size, each metric's sum, number of samples], summed on the device.

    Nothing here reads a value back to the host except read_interval, state_dict and result,
    so adding a step never waits for the GPU. Dividing the sums by the number of samples at the
    end weighs every sample alike, however the batches were cut.

    The sums are float64 where the device has it. Where it does not (Apple's MPS), they are
    float32 with the rounding error of every addition kept beside them (Knuth's TwoSum) and
    added back when read: counts and other integer sums stay exact up to 2**48, and a loss sum
    is off by about 1e-10 of itself (each batch's loss x its size rounds to float32), where plain
    float32 sums drift by about 3e-6 over 100,000 batches (tests/test_resume_changes.py).
    """

    def __init__(
        self,
        metric_fns: dict[str, MetricFn],
        device: torch.device,
        initial: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.metric_fns = metric_fns
        for metric in metric_fns.values():
            if keeps_own_state(metric):
                metric.reset()
        self.dtype = sum_dtype(device)
        # [loss x batch size, each metric's slots..., number of samples]
        num_sums = sum(num_slots(metric) for metric in metric_fns.values()) + 2
        self.totals = torch.zeros(num_sums, dtype=self.dtype, device=device)
        self.error = None if self.dtype == torch.float64 else torch.zeros_like(self.totals)
        self.logged = [0.0] * len(self.totals)  # the sums at the last read_interval, on the host
        if initial is not None and len(initial["totals"]) != num_sums:  # other metrics then
            raise UserError(
                f"the mid-epoch checkpoint kept {len(initial['totals']) - 2} metric sums, the "
                f"metrics configured now take {num_sums - 2}: resume with the metrics it was "
                "saved with, or from a checkpoint saved at the end of an epoch"
            )
        if initial is not None:  # the sums a mid-epoch checkpoint saved (float64, on the CPU)
            self.accumulate(initial["totals"].to(device, self.dtype))
            if self.error is not None:  # what float32 could not hold of them
                self.error += (initial["totals"] - self.totals.cpu().double()).to(
                    device, self.dtype
                )
            self.logged = initial["logged"].tolist()
        # After result(): each StatefulMetric's sums ({"<prefix>/<name>": [...]}), which a
        # checkpoint keeps so that a cross-validation summary can pool them over the folds.
        self.stateful_sums: dict[str, list[float]] = {}
        # Samples the initial sums hold: trained before the resume, in time not measured now.
        self.num_resumed = 0.0 if initial is None else float(initial["totals"][-1])
        # The first step whose loss was not finite (0: none yet), kept on the device.
        self.first_nonfinite = torch.zeros((), dtype=torch.int64, device=device)
        # Whether a step had an output for the metrics: without one (StepOutput.output None in
        # every step) result() reports the loss alone, not metrics of nothing.
        self.scored = False
        # The samples add() took on this rank, counted on the host (their sizes are host ints):
        # what the speed of a stretch of batches counts, the last batch of a pass maybe short.
        self.num_added = 0

    @torch.no_grad()
    def add(self, step: StepOutput, index: int = 0) -> None:
        """Add a step's sums; `index` (> 0) numbers the step, for the non-finite check."""
        size = step.batch_size if step.batch_size is not None else len(step.target)
        self.num_added += size
        # torch.full fills on the device; a host scalar copied over would wait for the GPU.
        batch_size = torch.full((), size, dtype=self.dtype, device=self.totals.device)
        sums = [(step.loss.detach().to(self.dtype) * batch_size).reshape(1)]
        self.scored = self.scored or step.output is not None
        for metric in self.metric_fns.values():
            if step.output is None:  # nothing to score: the metric's sums stay as they were
                sums.append(self.totals.new_zeros(num_slots(metric)))
            elif isinstance(metric, StatefulMetric):
                sums.append(metric.batch_sums(step.output, step.target).to(self.dtype).reshape(-1))
            elif keeps_own_state(metric):
                metric.update(step.output, step.target)
            else:
                sums.append(metric(step.output, step.target).to(self.dtype).reshape(1))
        self.accumulate(torch.cat([*sums, batch_size.reshape(1)]))
        is_new_fault = ~torch.isfinite(step.loss.detach()) & (self.first_nonfinite == 0)
        self.first_nonfinite = torch.where(is_new_fault, index, self.first_nonfinite)

    def accumulate(self, values: torch.Tensor) -> None:
        if self.error is None:
            self.totals += values
            return
        # TwoSum: total + error == totals + values exactly, whichever of the two is larger.
        total = self.totals + values
        back = total - self.totals
        self.error += (self.totals - (total - back)) + (values - back)
        self.totals = total

    def host_values(self, *extra: torch.Tensor) -> tuple[list[float], list[float]]:
        """(the sums as Python floats, `extra` as floats), read in one host-device copy."""
        parts = [self.totals, *([self.error] if self.error is not None else [])]
        values = torch.cat([*parts, *(item.to(self.dtype) for item in extra)]).tolist()
        count = len(self.totals)
        sums = values[:count]
        if self.error is not None:
            sums = [high + low for high, low in zip(sums, values[count : 2 * count], strict=True)]
        return sums, values[len(parts) * count :]

    def read_interval(self, stop_signum: int) -> tuple[list[float], int, int]:
        """(the sums added since the last call, the first step with a non-finite loss, the stop
        signal), the last two the maximum over the ranks: one host-device sync in all."""
        flags = torch.stack(
            [self.first_nonfinite, torch.full_like(self.first_nonfinite, stop_signum)]
        )
        sums, (first_fault, signum) = self.host_values(all_reduce_max(flags))
        interval = [value - logged for value, logged in zip(sums, self.logged, strict=True)]
        self.logged = sums
        return interval, int(first_fault), int(signum)

    def all_ranks(self) -> torch.Tensor:
        """The sums over every rank (a collective), as float64 on the CPU."""
        if self.error is None:
            return all_reduce_sum(self.totals.clone()).cpu()
        # Without float64 there is one process (MPS has no process-group backend).
        return self.totals.cpu().double() + self.error.cpu().double()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The sums and those at the last read over every rank (a collective), float64 on the
        CPU: what a mid-epoch checkpoint keeps, so that the resumed epoch and its first logged
        interval are exact."""
        logged = torch.tensor(self.logged, dtype=torch.float64)
        if self.error is None:  # reduced where the process group reduces (NCCL: on CUDA)
            logged = all_reduce_sum(logged.to(self.totals.device)).cpu()
        return {"totals": self.all_ranks(), "logged": logged}

    def result(self, prefix: str) -> dict[str, float]:
        """{"<prefix>/loss": ..., "<prefix>/<metric>": ..., "<prefix>/num_samples": n} over every
        rank (a collective); without any output for the metrics (StepOutput.output None), the
        loss and the count alone. After a mid-epoch resume, "<prefix>/num_resumed_samples" is
        how many of the n the checkpoint's sums held (the samples/s counts the others)."""
        totals = self.all_ranks()
        # Agreed by every rank: one without batches must still join the metrics' collectives.
        scored = bool(all_reduce_max(torch.tensor(int(self.scored), device=self.totals.device)))
        if scored or not self.metric_fns:
            result = to_metrics(totals, self.metric_fns, prefix)
            self.stateful_sums = stateful_sums(totals, self.metric_fns, prefix)
        else:
            result = {f"{prefix}/loss": float(totals[0] / totals[-1]),
                      f"{prefix}/num_samples": float(totals[-1])}  # fmt: skip
        if self.num_resumed:
            result[f"{prefix}/num_resumed_samples"] = self.num_resumed
        return result


def to_metrics(totals: torch.Tensor, metrics: dict[str, Any], prefix: str) -> dict[str, float]:
    """Summed [loss, metric slots..., count] as the metrics: per-sample sums as sample-weighted
    means, a StatefulMetric from its sums (and its breakdown), an object with its own state from
    its compute()."""
    values = totals.tolist()
    num_samples, offset = values[-1], 1
    result = {f"{prefix}/loss": values[0] / num_samples}
    for name, metric in metrics.items():
        size = num_slots(metric)
        if isinstance(metric, StatefulMetric):
            own = values[offset : offset + size]
            result[f"{prefix}/{name}"] = metric.compute(own)
            for key, value in metric.breakdown(own).items():
                result[f"{prefix}/{name}/{key}"] = value
        elif size == 0:
            result[f"{prefix}/{name}"] = float(metric.compute())
            metric.reset()
        else:
            result[f"{prefix}/{name}"] = values[offset] / num_samples
        offset += size
    result[f"{prefix}/num_samples"] = num_samples
    return result


def stateful_sums(
    totals: torch.Tensor, metrics: dict[str, Any], prefix: str
) -> dict[str, list[float]]:
    """{"<prefix>/<name>": its sums} of each StatefulMetric in summed [loss, slots..., count]."""
    values, offset, found = totals.tolist(), 1, {}
    for name, metric in metrics.items():
        size = num_slots(metric)
        if isinstance(metric, StatefulMetric):
            found[f"{prefix}/{name}"] = values[offset : offset + size]
        offset += size
    return found


def breakdown_table(metrics: dict[str, float]) -> list[str]:
    """The metrics' breakdowns (<split>/<metric>/<class>, e.g. MeanIoU's per_class) as lines of a
    table: a row per class, a column per metric; n/a where a class's value is not defined."""
    columns: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        _, metric, *part = key.split("/", 2)
        if part:
            columns.setdefault(metric, {})[part[0]] = value
    rows = list(dict.fromkeys(row for column in columns.values() for row in column))
    if not rows:
        return []
    width = max(12, *(len(row) for row in rows))
    lines = [f"{'class':<{width}}" + "".join(f"  {metric:>10}" for metric in columns)]
    for row in rows:
        cells = [column.get(row, math.nan) for column in columns.values()]
        shown = ["n/a" if math.isnan(cell) else f"{cell:.4f}" for cell in cells]
        lines.append(f"{row:<{width}}" + "".join(f"  {cell:>10}" for cell in shown))
    return lines

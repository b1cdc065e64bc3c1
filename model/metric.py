"""Metrics a config can name in "metrics".

A metric function returns the SUM of a per-sample score over the batch, as a 0-d tensor on the
batch's device. The trainer adds these sums and divides by the number of samples at the
end of the epoch, so every sample weighs the same however the batches are cut (a short
last batch does not count as much as a full one) and nothing syncs with the host per step.

A metric that is not a mean of per-sample scores (RMSE, R², F1, MeanIoU, PixelAccuracy) is a
StatefulMetric: the sums it needs, and its value from the epoch's totals (exact over batches and
ranks alike). A class with torchmetrics' update/compute/reset works too (pip install
torchmetrics, then e.g. `from torchmetrics.classification import MulticlassAUROC` here and in
__all__; its state is not in mid-epoch checkpoints).

Each one refuses in one line an output and a target that do not fit, rather than broadcast
them: class scores (B, C, ...) against class indices (B, ...) for accuracy, top-k, F1, MeanIoU
and PixelAccuracy (a segmentation's logits (B, C, H, W) against its masks (B, H, W): every
pixel counts; the last three, counted per class, are in model/class_metrics.py), one shape for
both otherwise. None reads a value back to the host or makes a tensor whose size depends on the
data (a boolean mask's, bincount's), so a step never waits for the GPU.
"""

import fractions
import inspect
import math
from typing import Any

import torch

from base import StatefulMetric
from model.class_metrics import F1, MeanIoU, PixelAccuracy, check_class_scores, describe
from utils.config.config_checks import metric_names
from utils.distributed.process_group import gather_objects, is_distributed
from utils.evaluation.metric_sums import sum_dtype
from utils.util import ConfigValueError, DataError, is_number

__all__ = [
    "F1",
    "R2",
    "RMSE",
    "MeanAveragePrecision",
    "MeanIoU",
    "PixelAccuracy",
    "accuracy",
    "psnr",
    "top_5_acc",
    "top_k_acc",
]  # fmt: skip


def accuracy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Sum over the batch of each sample's share of right top-1 predictions: 1 or 0 for logits
    (B, C) against class indices (B,); for (B, C, H, W) against masks (B, H, W), each image's
    share of right pixels (the epoch's mean is then the share of right pixels, for images of
    one size)."""
    check_class_scores(output, target, "accuracy")
    return share_per_sample(output.argmax(dim=1) == target)


def top_k_acc(output: torch.Tensor, target: torch.Tensor, k: int = 3) -> torch.Tensor:
    """Sum over the batch of each sample's share of targets among the k highest scores."""
    return top_k_share(output, target, k, "top_k_acc")


def top_5_acc(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The same with k = 5 (the ImageNet convention)."""
    return top_k_share(output, target, 5, "top_5_acc")


def top_k_share(output: torch.Tensor, target: torch.Tensor, k: int, name: str) -> torch.Tensor:
    """top_k_acc's sum; `name` is the metric's, for the message that refuses other shapes."""
    check_class_scores(output, target, name)
    top_k = output.topk(min(k, output.shape[1]), dim=1).indices  # (B, k, ...)
    return share_per_sample((top_k == target.unsqueeze(1)).any(dim=1))


def psnr(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Sum over the batch of each image's peak signal-to-noise ratio in dB, for images in [0, 1]:
    10 log10(1 / mean squared error), at most 100. output and target (B, C, H, W)."""
    check_same_shape(output, target, "psnr")
    dtype = sum_dtype(output.device)
    error = output.to(dtype) - target.to(dtype)
    # (B, values per image): -1 would be ambiguous for an empty batch
    squared_error = error.square().reshape(len(error), math.prod(error.shape[1:])).mean(dim=1)
    return (-10 * torch.log10(squared_error.clamp_min(1e-10))).sum()


class RMSE(StatefulMetric):
    """Root mean squared error over the epoch, output and target of one shape (B, ...). By
    default every value of a sample pools into one, sqrt(sum (output - target)^2 / n) over all
    of them (torchmetrics' MeanSquaredError(squared=False); an image's pixels). With
    `num_outputs` K > 1, each of a sample's K values is an output and the value is the mean of
    their RMSEs (scikit-learn's root_mean_squared_error, its default "uniform_average")."""

    def __init__(self, num_outputs: int = 1) -> None:
        if not isinstance(num_outputs, int) or isinstance(num_outputs, bool) or num_outputs < 1:
            raise ConfigValueError(f"num_outputs: must be an integer >= 1, got {num_outputs!r}")
        self.num_outputs = num_outputs
        # Per output its sum of squared errors, then n (for one output the 2 sums of mid-epoch
        # checkpoints always had).
        self.num_sums = num_outputs + 1

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        check_same_shape(output, target, "RMSE")
        dtype = sum_dtype(output.device)
        error = output.to(dtype) - target.to(dtype)
        if self.num_outputs == 1:  # (B x values, 1): every value of every sample pooled
            columns = error.reshape(-1, 1)
        else:  # (B, K): a column per output; B, not -1, for an empty batch
            check_num_outputs(target, self.num_outputs, "RMSE", "root_mean_squared_error")
            columns = error.reshape(len(error), self.num_outputs)
        return torch.cat([columns.square().sum(dim=0), error.new_full((1,), len(columns))])

    def compute(self, sums: list[float]) -> float:
        *squared_errors, count = sums
        return sum(math.sqrt(value / count) for value in squared_errors) / self.num_outputs


def check_num_outputs(target: torch.Tensor, num_outputs: int, name: str, reference: str) -> None:
    """Refuse, in one line, a target of another number of values a sample than `num_outputs`."""
    found = math.prod(target.shape[1:])
    if found != num_outputs:
        raise DataError(
            f"{name}: a sample has {found} target values ({describe(target)}) but "
            f'num_outputs is {num_outputs}: give {name} "args": {{"num_outputs": '
            f"{found}}} (the mean over the outputs, as scikit-learn's {reference})"
        )


class R2(StatefulMetric):
    """Coefficient of determination over all values of the epoch: 1 - SSE / SST per output,
    averaged over the outputs (scikit-learn's r2_score and torchmetrics' R2Score, their default
    "uniform_average"), output and target of one shape (B, ...). Each of a sample's values is an
    output: a regression's (B, 1) has one, (B, K) has K, which `num_outputs` gives (the sums are
    kept per output). An output whose target is constant scores 1 if predicted exactly, else 0,
    as scikit-learn's does (a tiny validation fold can be constant, and a monitored nan never
    improves: no best checkpoint); fewer than two samples give nan.

    SST = sum y^2 - (sum y)^2 / n cancels when the targets' mean is large against their spread:
    at mean 1e4 and spread 1, float64 sums keep 8 of its digits, at 1e6 four. So each target is
    split into a high and a low part of 12 significant bits (Dekker's split): a product of two
    parts has at most 24 bits, and the sums of them over a batch, the epoch and the ranks are
    exact in float64 for targets of one magnitude, which is when SST cancels (targets spread
    over magnitudes make SST large against the rounding). compute() subtracts exactly, in
    fractions. Exact for targets of float32 or narrower (what the engine's checked data gives);
    on a device without float64 (MPS), as float32 sums allow.
    """

    def __init__(self, num_outputs: int = 1) -> None:
        if not isinstance(num_outputs, int) or isinstance(num_outputs, bool) or num_outputs < 1:
            raise ConfigValueError(f"num_outputs: must be an integer >= 1, got {num_outputs!r}")
        self.num_outputs = num_outputs
        # Per output its SSE, then n, then per output the sums of high, low, high^2, high x low
        # and low^2 (for one output the order the 7 sums of mid-epoch checkpoints always had).
        self.num_sums = 1 + 6 * num_outputs

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        check_same_shape(output, target, "R2")
        check_num_outputs(target, self.num_outputs, "R2", "r2_score")
        num_outputs = self.num_outputs
        dtype = sum_dtype(target.device)
        # (B, K): a column per output; B, not -1, for an empty batch
        output = output.to(dtype).reshape(len(output), num_outputs)
        target = target.to(dtype).reshape(len(target), num_outputs)
        high, low = split(target)
        squared_errors = (output - target).square().sum(dim=0)  # (K,)
        parts = [high, low, high.square(), high * low, low.square()]
        part_sums = torch.stack([part.sum(dim=0) for part in parts])  # (5, K)
        count = target.new_full((1,), len(target))
        return torch.cat([squared_errors, count, part_sums.reshape(-1)])

    def compute(self, sums: list[float]) -> float:
        values = [fractions.Fraction(value) for value in sums]
        num_outputs, count = self.num_outputs, values[self.num_outputs]
        if count < 2:  # no spread to explain (scikit-learn's nan too)
            return float("nan")
        parts = values[num_outputs + 1 :]
        scores = []
        for index, squared_errors in enumerate(values[:num_outputs]):
            high, low, high_squares, products, low_squares = parts[index::num_outputs]
            total = high + low
            spread = high_squares + 2 * products + low_squares - total * total / count  # SST
            if spread > 0:
                scores.append(1 - squared_errors / spread)
            else:  # a constant target: 1 if hit exactly, else 0 (scikit-learn's force_finite)
                scores.append(fractions.Fraction(squared_errors == 0))
        return float(sum(scores) / num_outputs)


def split(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) with values = high + low exactly, high rounded to 12 significant bits (Dekker's
    split); for float32 values held in float64, low has at most 12 bits too."""
    significant_bits = 1 - int(math.log2(torch.finfo(values.dtype).eps))  # 53 for float64
    factor = 2.0 ** (significant_bits - 12) + 1
    scaled = values * factor
    high = scaled - (scaled - values)
    return high, values - high


def share_per_sample(hits: torch.Tensor) -> torch.Tensor:
    """The sum over the batch of each sample's share of True in hits (B, ...): its right
    elements over its number of elements, which is the same for every sample of a batch."""
    return hits.sum().to(sum_dtype(hits.device)) / math.prod(hits.shape[1:])


def check_same_shape(output: torch.Tensor, target: torch.Tensor, name: str) -> None:
    """Refuse an output and a target of other shapes: (B, 1) against (B,) would broadcast to
    (B, B) and compare every output with every target."""
    if output.shape != target.shape or output.dim() == 0:
        raise DataError(
            f"{name}: needs an output and a target of one shape (B, ...), got {describe(output)}"
            f" and {describe(target)}; give the target the output's shape (one value a "
            "sample: (B, 1), e.g. target.unsqueeze(1) in the dataset)"
        )


class MeanAveragePrecision:
    """A detector's mean average precision over every detection of the epoch: torchmetrics'
    MeanAveragePrecision (an optional extra: pip install -e ".[detection]", torchmetrics and
    pycocotools). The output is B dicts {"boxes" (N, 4) xyxy, "scores" (N,), "labels" (N,)}, the
    target B dicts {"boxes", "labels"}. iou_threshold: the IoU a detection needs to count (0.5:
    mAP@0.5, the PASCAL VOC measure); None: COCO's mean over 0.5, 0.55, ..., 0.95.

    Under torchrun every rank's detections are gathered and scored at once here: torchmetrics'
    own sync gathers its per-image lists one tensor at a time, which needs as many images on
    every rank (an uneven validation split is not). Its state is not in mid-epoch checkpoints:
    name it for validation, where detectors make detections (trainer/detection.py)."""

    def __init__(self, iou_threshold: float | None = 0.5, backend: str = "pycocotools") -> None:
        # torchmetrics takes any value and pycocotools clips it: 50 (meant as mAP@50) would
        # count only boxes of IoU 1, a negative one every box.
        if iou_threshold is not None and not (is_number(iou_threshold) and 0 < iou_threshold <= 1):
            raise ConfigValueError(
                "MeanAveragePrecision: iou_threshold must be a number in (0, 1] (0.5: mAP@0.5), "
                f"or null for COCO's 0.5 to 0.95, got {iou_threshold!r}"
            )
        self.iou_threshold, self.backend = iou_threshold, backend
        self.metric = self.reference()  # refuses a missing backend before anything is written
        self.images: list[tuple[dict, dict]] = []  # under torchrun: (output, target) per image

    def reference(self) -> Any:
        """torchmetrics' metric, which scores what it is given without syncing the ranks."""
        try:
            from torchmetrics.detection import MeanAveragePrecision as Reference

            thresholds = None if self.iou_threshold is None else [self.iou_threshold]
            return Reference(iou_thresholds=thresholds, backend=self.backend, sync_on_compute=False)
        except (ImportError, ValueError) as error:  # ModuleNotFoundError: a missing backend
            raise ConfigValueError(
                f"MeanAveragePrecision: {str(error).splitlines()[0]} (the extra: pip install "
                '-e ".[detection]")'
            ) from None

    def to(self, device: torch.device) -> "MeanAveragePrecision":
        self.metric = self.metric.to(device)
        return self

    def update(self, output: list[dict], target: list[dict]) -> None:
        self.metric.update(output, target)  # checks the dicts' keys, shapes and dtypes
        if is_distributed():  # kept on the CPU for the gathering at compute()
            cpu = [{key: value.detach().cpu() for key, value in item.items()} for item in output]
            truth = [{key: value.cpu() for key, value in item.items()} for item in target]
            self.images += zip(cpu, truth, strict=True)

    def compute(self) -> torch.Tensor:
        if not is_distributed():
            return self.metric.compute()["map"]
        images = [image for rank in gather_objects(self.images) for image in rank]
        everything = self.reference()
        if images:
            outputs, targets = zip(*images, strict=True)
            everything.update(list(outputs), list(targets))
        return everything.compute()["map"]

    def reset(self) -> None:
        self.metric.reset()
        self.images = []


def sample_mean_names(entries: list) -> set[str]:
    """The names (utils.config.config_checks.metric_names) of the config's "metrics" `entries`
    that are means over samples, and "loss": every metric given as a function here (a per-sample
    sum over num_samples). A StatefulMetric (F1, R2, RMSE) or a torchmetrics class is not one;
    a checkpoint keeps its value, not the sums a cross-validation summary would pool from."""
    functions = {
        name
        for name, entry in zip(metric_names(entries), entries, strict=True)
        if not inspect.isclass(globals().get(entry if isinstance(entry, str) else entry["type"]))
    }
    return {"loss", *functions}

"""Metrics a config can name in "metrics".

A metric function returns the SUM of a per-sample score over the batch, as a 0-d tensor on the
batch's device. The trainer adds these sums and divides by the number of samples at the
end of the epoch, so every sample weighs the same however the batches are cut (a short
last batch does not count as much as a full one) and nothing syncs with the host per step.

A metric that is not a mean of per-sample scores (RMSE, R², F1) is a StatefulMetric: the sums
it needs, and its value from the epoch's totals (exact over batches and ranks alike). A class
with torchmetrics' update/compute/reset works too (pip install torchmetrics, then e.g.
`from torchmetrics.classification import MulticlassAUROC` here and in __all__; its state is
not in mid-epoch checkpoints).
"""

import math

import torch

from base import StatefulMetric

__all__ = ["F1", "R2", "RMSE", "accuracy", "psnr", "top_5_acc", "top_k_acc"]


def accuracy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Number of samples whose top-1 prediction is right. output (B, C), target (B,)."""
    return (output.argmax(dim=1) == target).sum()


def top_k_acc(output: torch.Tensor, target: torch.Tensor, k: int = 3) -> torch.Tensor:
    """Number of samples whose target is among the k highest scores."""
    top_k = output.topk(min(k, output.shape[1]), dim=1).indices  # (B, k)
    return (top_k == target.unsqueeze(1)).any(dim=1).sum()


def top_5_acc(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Number of samples whose target is among the 5 highest scores (the ImageNet convention)."""
    return top_k_acc(output, target, k=5)


def psnr(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Sum over the batch of each image's peak signal-to-noise ratio in dB, for images in [0, 1]:
    10 log10(1 / mean squared error). output and target (B, C, H, W)."""
    squared_error = (output.float() - target.float()).square().flatten(1).mean(dim=1)  # (B,)
    return (-10 * torch.log10(squared_error.clamp_min(1e-10))).sum()


class RMSE(StatefulMetric):
    """Root mean squared error over all values of the epoch: sqrt(sum (output - target)^2 / n),
    output and target of one shape (a regression's (B, 1) and (B, 1))."""

    num_sums = 2

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        error = (output - target).reshape(-1)  # float32 here; the engine sums in float64
        return torch.stack([error.square().sum(), torch.ones_like(error).sum()])

    def compute(self, sums: list[float]) -> float:
        squared_errors, count = sums
        return math.sqrt(squared_errors / count)


class R2(StatefulMetric):
    """Coefficient of determination over all values of the epoch, 1 - SSE / SST (scikit-learn's
    r2_score for one output): SST = sum y^2 - (sum y)^2 / n, from sums that add up over ranks."""

    num_sums = 4

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        output, target = output.reshape(-1), target.reshape(-1)
        squared_errors = (output - target).square().sum()
        return torch.stack(
            [squared_errors, target.sum(), target.square().sum(), torch.ones_like(target).sum()]
        )

    def compute(self, sums: list[float]) -> float:
        squared_errors, total, squares, count = sums
        spread = squares - total * total / count
        return 1.0 - squared_errors / spread if spread > 0 else float("nan")


class F1(StatefulMetric):
    """Macro F1 of a classifier, logits (B, C) against class indices (B,): per class
    2TP / (2TP + FP + FN), averaged over the classes that occur as targets or predictions
    (scikit-learn's f1_score(average="macro"))."""

    def __init__(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.num_sums = 3 * num_classes  # per class: true positives, predicted, actual

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        predicted = output.argmax(dim=1)
        counts = [
            torch.bincount(predicted[predicted == target], minlength=self.num_classes),
            torch.bincount(predicted, minlength=self.num_classes),
            torch.bincount(target, minlength=self.num_classes),
        ]
        return torch.cat([count[: self.num_classes] for count in counts])

    def compute(self, sums: list[float]) -> float:
        classes = self.num_classes
        hits, predicted, actual = sums[:classes], sums[classes : 2 * classes], sums[2 * classes :]
        scores = [
            2 * tp / (p + a) for tp, p, a in zip(hits, predicted, actual, strict=True) if p + a
        ]
        return sum(scores) / len(scores) if scores else float("nan")

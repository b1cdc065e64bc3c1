"""Classifier metrics from the split's counts per class: F1, MeanIoU and PixelAccuracy (named in
config through model/metric.py), and the check that an output and a target are class scores and
class indices, which every classification metric makes."""

import abc
import math

import torch

from base import StatefulMetric
from utils.util import ConfigValueError, DataError


class ClassCounts(StatefulMetric, abc.ABC):
    """A classifier's metric from the split's counts per class (hits, predictions, targets), logits
    (B, C, ...) against class indices (B, ...), such as a segmenter's (B, C, H, W) against masks
    (B, H, W): every element counts once, whatever image it is in. Its value is by default the
    mean of the per-class values over the classes that occur as targets or predictions. Elements
    whose target is ignore_index are left out, and so is that class (a mask's "void" 255, or 0 to
    score the foreground alone); a target that is neither a class nor ignore_index is refused at
    the end of the split. With per_class, each class's value too, as <split>/<metric>/<class>
    (class_names: the data's, which build.py passes, else the class indices)."""

    def __init__(
        self,
        num_classes: int,
        ignore_index: int | None = None,
        per_class: bool = False,
        class_names: list[str] | None = None,
    ) -> None:
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
            raise ConfigValueError(f"num_classes: must be an integer >= 1, got {num_classes!r}")
        if not isinstance(ignore_index, int | None) or isinstance(ignore_index, bool):
            raise ConfigValueError(
                f"ignore_index: must be an integer or null, got {ignore_index!r}"
            )
        if class_names is not None and len(class_names) != num_classes:
            raise ConfigValueError(
                f"num_classes is {num_classes} but class_names (the data's unless args give them) "
                f"has {len(class_names)}: {', '.join(map(str, class_names[:5]))}"
            )
        self.num_classes, self.ignore_index, self.per_class = num_classes, ignore_index, per_class
        self.class_names = [str(name) for name in class_names or range(num_classes)]
        self.num_sums = 3 * num_classes + 1  # per class: hits, predictions, targets; outside

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        name = type(self).__name__
        return class_counts(output, target, self.num_classes, name, self.ignore_index)

    @abc.abstractmethod
    def class_value(self, hits: float, predicted: float, actual: float) -> float:
        """One class's value from its counts; nan where it is not defined."""

    def check_targets(self, sums: list[float]) -> None:
        """Refuse the split if some of its targets were no class (nor ignore_index)."""
        if sums[-1]:
            ignored = "" if self.ignore_index is None else f" nor ignore_index {self.ignore_index}"
            raise DataError(
                f"{type(self).__name__}: {int(sums[-1])} targets were outside the classes 0.."
                f"{self.num_classes - 1}{ignored}; a label for unlabelled pixels (e.g. 255) "
                "needs ignore_index, more classes need num_classes"
            )

    def class_values(self, sums: list[float]) -> dict[str, float]:
        """{class name: value} of every scored class (all but ignore_index)."""
        self.check_targets(sums)
        classes = self.num_classes
        counts = zip(
            sums[:classes], sums[classes : 2 * classes], sums[2 * classes : -1], strict=True
        )
        return {
            name: self.class_value(*count)
            for index, (name, count) in enumerate(zip(self.class_names, counts, strict=True))
            if index != self.ignore_index
        }

    def compute(self, sums: list[float]) -> float:
        scores = [value for value in self.class_values(sums).values() if not math.isnan(value)]
        return sum(scores) / len(scores) if scores else float("nan")

    def breakdown(self, sums: list[float]) -> dict[str, float]:
        return self.class_values(sums) if self.per_class else {}


class F1(ClassCounts):
    """Macro F1: per class 2TP / (2TP + FP + FN), averaged over the classes that occur as targets
    or predictions (scikit-learn's f1_score(average="macro") over every element)."""

    def class_value(self, hits: float, predicted: float, actual: float) -> float:
        return 2 * hits / (predicted + actual) if predicted + actual else float("nan")


class MeanIoU(ClassCounts):
    """Mean intersection over union: per class TP / (TP + FP + FN) over the whole split, averaged
    over the classes present as targets or predictions (torchmetrics' MulticlassJaccardIndex(
    average="macro"), with the same ignore_index)."""

    def class_value(self, hits: float, predicted: float, actual: float) -> float:
        union = predicted + actual - hits
        return hits / union if union else float("nan")


class PixelAccuracy(ClassCounts):
    """The share of right elements (pixels) over the whole split, those whose target is
    ignore_index left out (torchmetrics' MulticlassAccuracy(average="micro")); per class, the
    share of its elements predicted right (its recall)."""

    def class_value(self, hits: float, predicted: float, actual: float) -> float:
        return hits / actual if actual else float("nan")

    def compute(self, sums: list[float]) -> float:
        self.check_targets(sums)
        classes = self.num_classes
        total = sum(sums[2 * classes : 3 * classes])
        return sum(sums[:classes]) / total if total else float("nan")


def class_counts(
    output: torch.Tensor,
    target: torch.Tensor,
    num_classes: int,
    name: str,
    ignore_index: int | None = None,
) -> torch.Tensor:
    """Per class [hits, predictions, targets] of logits (B, C, ...) against class indices
    (B, ...), elements whose target is ignore_index left out, then the number of targets outside
    0..C-1 (counted, not scattered: an index out of range is a device-side assert on a GPU):
    3 C + 1 int64 counts."""
    check_class_scores(output, target, name, num_classes)
    predicted = output.argmax(dim=1).reshape(-1)  # (N,): every element's class
    target = target.reshape(-1).long()
    in_range = (target >= 0) & (target < num_classes)
    ignored = target == ignore_index if ignore_index is not None else torch.zeros_like(in_range)
    kept = (in_range & ~ignored).long()
    target = target * kept  # an element not counted adds 0 to class 0's slots: in range
    # Counted into fixed slots with scatter_add_, as ConfusionMatrix does: a boolean mask's or
    # bincount's size depends on the data, and reading it would wait for the GPU.
    slots = torch.cat([predicted, num_classes + predicted, 2 * num_classes + target])
    counts = torch.cat([(predicted == target).long() * kept, kept, kept])
    sums = torch.zeros(3 * num_classes, dtype=torch.int64, device=output.device)
    outside = (~in_range & ~ignored).sum().reshape(1)
    return torch.cat([sums.scatter_add_(0, slots, counts), outside])


def check_class_scores(
    output: torch.Tensor, target: torch.Tensor, name: str, num_classes: int | None = None
) -> None:
    """Refuse what is not class scores (B, C, ...) against integer class indices (B, ...)."""
    fits = (
        output.dim() >= 2
        and target.shape == output.shape[:1] + output.shape[2:]
        and not target.is_floating_point()
        and num_classes in (None, output.shape[1])
    )
    if not fits:
        classes = "C" if num_classes is None else str(num_classes)
        raise DataError(
            f"{name}: needs class scores (B, {classes}, ...) and integer class indices "
            f"(B, ...), got an output {describe(output)} and a target {describe(target)}"
        )


def describe(tensor: torch.Tensor) -> str:
    """ "(32, 1) float32": a tensor's shape and dtype, for messages."""
    return f"{tuple(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}"

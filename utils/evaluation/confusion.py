"""A classifier's confusion matrix: exact integer counts, per-class precision, recall and F1, and
a picture of it drawn with Pillow (no plotting library). Shared by test.py and the trainer."""

import torch
from PIL import Image, ImageDraw, ImageFont
from torchvision.transforms.functional import pil_to_tensor

from utils.distributed.process_group import all_reduce_sum
from utils.evaluation.metric_sums import StepOutput

WHITE, BLACK, BLUE, GREY = (255, 255, 255), (0, 0, 0), (8, 48, 107), (230, 230, 230)
MAX_SIDE = 800  # pixels of the matrix itself, at most
MAX_CELL = 40  # pixels of a cell, at most
MIN_LABELLED_CELL = 12  # smaller cells go without class labels
MIN_COUNTED_CELL = 24  # smaller cells go without their count written in


class ConfusionMatrix:
    """counts[true class, predicted class] over every sample added, kept on the device; samples
    whose target is ignore_index (the data's: no class, e.g. unlabelled) are left out.

    Adding a batch never waits for the device: scatter_add_ needs no host read (bincount would,
    for its size), and on a 1-d tensor it has a deterministic CUDA implementation.
    """

    def __init__(
        self, num_classes: int, device: torch.device, ignore_index: int | None = None
    ) -> None:
        self.num_classes, self.ignore_index = num_classes, ignore_index
        # The C * C cells, row-major, then one slot that spoils the matrix when it is not 0: a
        # batch that was not (logits (B, C), labels (B,)), or a target neither a class nor
        # ignore_index (the metrics refuse those). Summed over the ranks with the cells, so that
        # every rank agrees whether there is a matrix to show.
        self.counts = torch.zeros(num_classes * num_classes + 1, dtype=torch.int64, device=device)

    @torch.no_grad()
    def add(self, result: StepOutput) -> None:
        """Count one step's logits (B, num_classes) against its class indices (B,)."""
        output, target = result.output, result.target
        shapes_fit = (
            isinstance(output, torch.Tensor)
            and isinstance(target, torch.Tensor)
            and output.ndim == 2
            and output.shape[1] == self.num_classes
            and target.shape == output.shape[:1]
            and not target.is_floating_point()
        )
        if not shapes_fit:
            self.counts[-1] += 1
            return
        predicted = output.argmax(dim=1)  # (B,)
        target = target.long()
        in_range = (target >= 0) & (target < self.num_classes)
        ignored = (
            target == self.ignore_index
            if self.ignore_index is not None
            else torch.zeros_like(in_range)
        )
        # (B,) row-major indices of (true, predicted); a target out of range goes to the last
        # slot (an index out of range would be a device-side assert on a GPU), adding 1 unless
        # it is ignore_index.
        cells = torch.where(
            in_range, target * self.num_classes + predicted, self.counts.numel() - 1
        )
        self.counts.scatter_add_(0, cells, (~ignored).long())

    def all_ranks(self) -> torch.Tensor | None:
        """The (num_classes, num_classes) counts summed over every rank (a collective), on the CPU;
        None where there is no matrix to show (see __init__), rather than a wrong one."""
        counts = all_reduce_sum(self.counts.clone()).cpu()
        if counts[-1]:
            return None
        return counts[:-1].view(self.num_classes, self.num_classes)


def class_scores(counts: list[list[int]], class_names: list[str]) -> dict[str, dict]:
    """{name: {"precision", "recall", "f1", "support"}} from counts[true][predicted].

    A score whose denominator is 0 is None (null in JSON), not 0: the precision of a class never
    predicted, the recall of a class without samples. F1 = 2 TP / (2 TP + FP + FN), the harmonic
    mean of the two where both exist: 0.0 for a class with samples that is never predicted,
    None only for a class neither present nor predicted.
    """
    scores = {}
    for index, name in enumerate(class_names):
        hits = counts[index][index]
        support = sum(counts[index])  # samples of this class: TP + FN
        num_predicted = sum(row[index] for row in counts)  # TP + FP
        scores[name] = {
            "precision": hits / num_predicted if num_predicted else None,
            "recall": hits / support if support else None,
            "f1": 2 * hits / (support + num_predicted) if support + num_predicted else None,
            "support": support,
        }
    return scores


def confusion_results(counts: torch.Tensor, class_names: list[str]) -> dict:
    """What test.py --json adds for a classifier: "confusion_matrix" (counts, rows the true class,
    in class_names order), "per_class" (class_scores) and "per_class_accuracy" (the recall)."""
    per_class = class_scores(counts.tolist(), class_names)
    return {
        "per_class_accuracy": {name: scores["recall"] for name, scores in per_class.items()},
        "per_class": per_class,
        "confusion_matrix": counts.tolist(),
    }


def shade(share: float) -> tuple[int, int, int]:
    """White for 0, dark blue for 1: the share of a true class that went to a cell."""
    return tuple(round(low + share * (high - low)) for low, high in zip(WHITE, BLUE, strict=True))


def draw_confusion_matrix(counts: torch.Tensor, class_names: list[str]) -> Image.Image:
    """An RGB picture of counts (C, C): rows the true class, columns the predicted one, each cell
    shaded by its share of the row (a recall-normalised matrix) and, when the cells are big
    enough, labelled with its count; classes without samples are grey."""
    num_classes = len(class_names)
    cell = max(1, min(MAX_CELL, MAX_SIDE // num_classes))
    labelled = cell >= MIN_LABELLED_CELL
    font = ImageFont.load_default()  # Pillow's own font: no font file to find
    row_labels = [f"{index} {name[:12]}" for index, name in enumerate(class_names)]
    left = 8 + max(text_size(label, font)[0] for label in row_labels) if labelled else 0
    top = 34 if labelled else 0
    side = cell * num_classes
    image = Image.new("RGB", (left + side + 4, top + side + 4), WHITE)
    draw = ImageDraw.Draw(image)
    if labelled:
        draw.text((4, 2), "rows: true class, columns: predicted", fill=BLACK, font=font)
        for predicted in range(num_classes):
            write(draw, str(predicted), (left + predicted * cell + cell // 2, top - 8), font, BLACK)
    for true_class, row in enumerate(counts.tolist()):
        total = sum(row)
        y = top + true_class * cell
        if labelled:
            height = text_size(row_labels[true_class], font)[1]
            draw.text((4, y + (cell - height) // 2), row_labels[true_class], fill=BLACK, font=font)
        for predicted, count in enumerate(row):
            x = left + predicted * cell
            share = count / total if total else 0.0
            draw.rectangle([x, y, x + cell - 1, y + cell - 1], fill=shade(share) if total else GREY)
            if cell >= MIN_COUNTED_CELL and count:
                ink = WHITE if share > 0.5 else BLACK
                write(draw, str(count), (x + cell // 2, y + cell // 2), font, ink)
    return image


def text_size(text: str, font: ImageFont.ImageFont) -> tuple[int, int]:
    """(width, height) of `text` in pixels."""
    left, top, right, bottom = font.getbbox(text)
    return right - left, bottom - top


def write(
    draw: ImageDraw.ImageDraw,
    text: str,
    center: tuple[int, int],
    font: ImageFont.ImageFont,
    ink: tuple[int, int, int],
) -> None:
    """`text` centred on `center` (Pillow's anchors do not work with every font it loads)."""
    width, height = text_size(text, font)
    draw.text((center[0] - width // 2, center[1] - height // 2), text, fill=ink, font=font)


def image_tensor(image: Image.Image) -> torch.Tensor:
    """(3, H, W) floats in [0, 1], as the loggers take images."""
    return pil_to_tensor(image).float() / 255

"""A small anchor-free detector (FCOS-style, one feature level), trained from scratch.

forward(images) -> the detections, a list of B dicts {"boxes": float (N, 4) xyxy in pixels,
"scores": float (N,), "labels": int64 (N,)}; forward(images, targets) -> a dict of losses
{"classification", "box"} against B target dicts {"boxes": (M, 4), "labels": (M,)}, in training
and evaluation mode alike (the validation loss). trainer/detection.py sums the losses.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import batched_nms, generalized_box_iou_loss, sigmoid_focal_loss

from base import BaseModel
from utils import ConfigValueError
from utils.util import is_number

STRIDE = 4  # pixels per cell of the feature map the heads read


def conv_block(
    in_channels: int, out_channels: int, stride: int = 1, dilation: int = 1
) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, stride, padding=dilation, dilation=dilation,
                  bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )  # fmt: skip


class TinyDetector(BaseModel):
    """A CNN to stride 4 (receptive field about 45 pixels), then two 3x3 heads on every cell:
    num_classes logits (sigmoid, focal loss) and the distances from the cell's centre to the box's
    four sides (GIoU loss). A cell learns a box when its centre lies in the box's central region
    (centre_radius cells from its centre); the smallest box wins a cell two boxes claim."""

    def __init__(
        self,
        *,
        num_classes: int = 3,
        width: int = 32,
        centre_radius: float = 1.5,
        score_threshold: float = 0.05,
        nms_threshold: float = 0.5,
        max_detections: int = 50,
    ) -> None:
        super().__init__()
        # Out of range, each would train without a word: no detections (score_threshold 5, a
        # percent; max_detections 0), no suppression (nms_threshold 50), no box to learn
        # (centre_radius 0), the last detection dropped (max_detections -1).
        for name, value in (
            ("num_classes", num_classes),
            ("width", width),
            ("max_detections", max_detections),
        ):
            if type(value) is not int or value < 1:
                raise ConfigValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not (is_number(centre_radius) and centre_radius > 0):
            raise ConfigValueError(f"centre_radius must be a number > 0, got {centre_radius!r}")
        if not (is_number(score_threshold) and 0 <= score_threshold < 1):
            raise ConfigValueError(
                f"score_threshold must be a number in [0, 1), got {score_threshold!r}"
            )
        if not (is_number(nms_threshold) and 0 <= nms_threshold <= 1):
            raise ConfigValueError(
                f"nms_threshold must be a number in [0, 1], got {nms_threshold!r}"
            )
        self.num_classes, self.centre_radius = num_classes, centre_radius
        self.score_threshold, self.nms_threshold = score_threshold, nms_threshold
        self.max_detections = max_detections
        self.layers = nn.Sequential(
            conv_block(3, width),
            conv_block(width, 2 * width, stride=2),
            conv_block(2 * width, 2 * width),
            conv_block(2 * width, 4 * width, stride=2),
            conv_block(4 * width, 4 * width),
            conv_block(4 * width, 4 * width, dilation=2),
            conv_block(4 * width, 4 * width, dilation=4),
        )
        self.classifier = nn.Conv2d(4 * width, num_classes, 3, padding=1)
        self.box_head = nn.Conv2d(4 * width, 4, 3, padding=1)
        # Start every cell at a 1% object probability: the focal loss's prior (Lin et al., 2017),
        # else the many background cells swamp the first steps.
        nn.init.constant_(self.classifier.bias, -math.log(99))

    def forward(
        self, images: torch.Tensor, targets: list[dict[str, torch.Tensor]] | None = None
    ) -> list[dict[str, torch.Tensor]] | dict[str, torch.Tensor]:
        features = self.layers(images)  # (B, 4 width, H / 4, W / 4)
        logits = self.classifier(features).flatten(2).transpose(1, 2)  # (B, cells, classes)
        # Distances to the left, top, right and bottom sides in pixels, > 0: (B, cells, 4).
        distances = F.softplus(self.box_head(features)).flatten(2).transpose(1, 2) * STRIDE
        centres = cell_centres(features.shape[-2:], images.device)  # (cells, 2) x, y
        boxes = torch.cat([centres - distances[..., :2], centres + distances[..., 2:]], dim=-1)
        if targets is None:
            return self.detect(logits, boxes)
        return self.losses(logits, boxes, centres, targets)

    def losses(
        self,
        logits: torch.Tensor,
        boxes: torch.Tensor,
        centres: torch.Tensor,
        targets: list[dict[str, torch.Tensor]],
    ) -> dict[str, torch.Tensor]:
        """Focal loss of every cell's classes and GIoU loss of the cells that learn a box, each
        divided by the batch's number of such cells."""
        class_targets = torch.zeros_like(logits)  # (B, cells, classes)
        box_targets = torch.zeros_like(boxes)  # (B, cells, 4)
        positive = torch.zeros(logits.shape[:2], dtype=torch.bool, device=logits.device)
        for index, target in enumerate(targets):
            gt_boxes, labels = target["boxes"], target["labels"]  # (M, 4), (M,)
            if len(gt_boxes) == 0:
                continue
            x, y = centres[:, 0:1], centres[:, 1:2]  # (cells, 1) against (M,)
            inside = (x > gt_boxes[:, 0]) & (x < gt_boxes[:, 2])
            inside &= (y > gt_boxes[:, 1]) & (y < gt_boxes[:, 3])
            middle = (gt_boxes[:, :2] + gt_boxes[:, 2:]) / 2  # (M, 2)
            near = ((centres[:, None] - middle).abs() < self.centre_radius * STRIDE).all(-1)
            area = (gt_boxes[:, 2] - gt_boxes[:, 0]) * (gt_boxes[:, 3] - gt_boxes[:, 1])
            cost = torch.where(inside & near, area, math.inf)  # (cells, M)
            smallest, assigned = cost.min(dim=1)
            cells = torch.isfinite(smallest)
            positive[index] = cells
            class_targets[index, cells, labels[assigned[cells]]] = 1.0
            box_targets[index, cells] = gt_boxes[assigned[cells]]
        num_positive = positive.sum().clamp_min(1)
        classification = sigmoid_focal_loss(logits, class_targets, reduction="sum") / num_positive
        box = generalized_box_iou_loss(boxes[positive], box_targets[positive], reduction="sum")
        return {"classification": classification, "box": box / num_positive}

    @torch.no_grad()
    def detect(self, logits: torch.Tensor, boxes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Per image: the (cell, class) pairs scoring over score_threshold, non-maximum
        suppression per class, the max_detections best."""
        detections = []
        for image_logits, image_boxes in zip(logits, boxes, strict=True):
            scores = image_logits.sigmoid().flatten()  # (cells x classes,)
            keep = torch.nonzero(scores > self.score_threshold).squeeze(1)
            keep = keep[scores[keep].topk(min(len(keep), 10 * self.max_detections)).indices]
            cells, labels = keep // self.num_classes, keep % self.num_classes
            kept = batched_nms(image_boxes[cells], scores[keep], labels, self.nms_threshold)
            kept = kept[: self.max_detections]
            detections.append(
                {"boxes": image_boxes[cells[kept]], "scores": scores[keep[kept]],
                 "labels": labels[kept]}
            )  # fmt: skip
        return detections


def cell_centres(size: torch.Size, device: torch.device) -> torch.Tensor:
    """The pixel coordinates (x, y) of the centre of every cell of an (h, w) map: (h w, 2)."""
    rows = torch.arange(size[0], device=device, dtype=torch.float32) * STRIDE + STRIDE / 2
    columns = torch.arange(size[1], device=device, dtype=torch.float32) * STRIDE + STRIDE / 2
    y, x = torch.meshgrid(rows, columns, indexing="ij")
    return torch.stack([x.flatten(), y.flatten()], dim=1)

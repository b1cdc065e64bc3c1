"""Object detection: the model computes its own losses (a dict) from the images and the target
dicts, and its detections (a list of dicts) from the images alone (model/detector.py)."""

import torch

from base import StepOutput
from trainer.trainer import Trainer


class DetectionTrainer(Trainer):
    """Batches of (images (B, 3, H, W), B dicts {"boxes": (N, 4), "labels": (N,)}). The loss is
    config "loss" (sum_of_losses) of the model's dict of losses. Training has no metrics (no
    detections are made: output=None); validation runs the model twice, once with the targets
    for its loss and once without for the detections the metrics (mAP) read: a model that
    returns both from one pass could do it once, at the cost of a forward that answers
    differently by mode."""

    def training_step(self, batch: tuple[torch.Tensor, list[dict]]) -> StepOutput:
        images, targets = batch
        losses = self.model(images, targets)  # {"classification": 0-d, "box": 0-d}
        return StepOutput(loss=self.criterion(losses, targets), target=targets)

    def validation_step(self, batch: tuple[torch.Tensor, list[dict]]) -> StepOutput:
        images, targets = batch
        loss = self.criterion(self.model(images, targets), targets)
        detections = self.model(images)  # B dicts {"boxes", "scores", "labels"}
        return StepOutput(loss=loss, output=detections, target=targets)

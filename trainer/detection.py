"""Object detection: the model computes its own losses (a dict) from the images and the target
dicts, and its detections (a list of dicts) from the images alone (model/detector.py)."""

from typing import Any

import torch

from base import StepOutput
from data_loader.transforms import no_mixing
from trainer.trainer import Trainer
from utils.util import ConfigError


class DetectionTrainer(Trainer):
    """Batches of (images (B, 3, H, W), B dicts {"boxes": (N, 4), "labels": (N,)}). The loss is
    config "loss" (sum_of_losses) of the model's dict of losses. Training has no metrics (no
    detections are made: output=None); validation runs the model twice, once with the targets
    for its loss and once without for the detections the metrics (mAP) read: a model that
    returns both from one pass could do it once, at the cost of a forward that answers
    differently by mode."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The step below does not call self.mix: refused rather than ignored.
        if self.mix is not no_mixing:
            raise ConfigError(
                f"{self.config.source}: batch_mixing: DetectionTrainer does not mix batches "
                "(MixUp and CutMix would have to mix the boxes too); set mixup_alpha and "
                "cutmix_alpha to 0"
            )

    def training_step(self, batch: tuple[torch.Tensor, list[dict]]) -> StepOutput:
        images, targets = batch
        losses = self.model(images, targets)  # {"classification": 0-d, "box": 0-d}
        return StepOutput(loss=self.criterion(losses, targets), target=targets)

    def validation_step(self, batch: tuple[torch.Tensor, list[dict]]) -> StepOutput:
        images, targets = batch
        loss = self.criterion(self.model(images, targets), targets)
        detections = self.model(images)  # B dicts {"boxes", "scores", "labels"}
        return StepOutput(loss=loss, output=detections, target=targets)

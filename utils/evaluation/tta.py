"""Test-time augmentation (trainer.tta_flip, tta_translate, tta_average): the model's output
for an image as the average over views of it, in validation and in test.py."""

import math

import torch
from torch import nn
from torch.nn import functional

from utils.util import DataError

# trainer.tta_average: how the views' outputs are combined.
TTA_AVERAGES = ("logits", "probabilities")


class AverageOverViews(nn.Module):
    """model(images) averaged over views of images (B, C, H, W): the images themselves, their
    mirror image (flip), and each of these shifted by `translate` pixels down and right and by
    as many up and left, the edges mirrored (reflect padding, as the recipe's training crops).

    average "logits": the mean of the views' logits; "probabilities": the log of the mean of
    their softmax probabilities, which is again a valid input to argmax and cross entropy.
    Every view weighs the same: 2 views with flip alone, 3 with translate alone, 6 with both.
    """

    def __init__(self, model: nn.Module, *, flip: bool, translate: int, average: str) -> None:
        super().__init__()
        self.model, self.flip, self.translate, self.average = model, flip, translate, average

    def views(self, images: torch.Tensor) -> list[torch.Tensor]:
        if images.dim() != 4:
            raise DataError(
                f"trainer.tta_flip / tta_translate: need batches of images (B, C, H, W), got "
                f"inputs of shape {tuple(images.shape)}"
            )
        views = [images, images.flip(-1)] if self.flip else [images]
        if self.translate:
            shift, (height, width) = self.translate, images.shape[-2:]
            for view in list(views):
                padded = functional.pad(view, (shift,) * 4, mode="reflect")  # (B, C, H+2s, W+2s)
                views.append(padded[..., 2 * shift :, 2 * shift :])  # the content moved up-left
                views.append(padded[..., :height, :width])  # ...and down-right
        return views

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        outputs = torch.stack(
            [self.model(view).float() for view in self.views(images)]
        )  # (V, B, K)
        if self.average == "logits":
            return outputs.mean(dim=0)
        return torch.logsumexp(outputs.log_softmax(dim=-1), dim=0) - math.log(len(outputs))

"""Test-time augmentation (trainer.tta_flip, tta_translate, tta_average, tta_translate_weight):
the model's output for an image as the weighted average over views of it, in validation and in
test.py."""

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

    An output per image (class scores (B, K), values (B,)) is averaged as it is. A dense output,
    one value per pixel ((B, C', H, W), a denoised image or a segmentation's logits), is first
    mapped back onto the input's pixels (mirrored back, shifted back), and each pixel averages
    the views that saw it: a shifted view never saw the `translate` rows and columns it moved
    out, and the mirrored edges it shows instead are not theirs. Any other output shape has no
    such map and is refused.

    average "logits": the weighted mean of the views' outputs; "probabilities": the log of the
    weighted mean of their softmax probabilities over dim 1, again a valid input to argmax and
    cross entropy. An unshifted view weighs 1 and a shifted one `translate_weight`, normalised
    over the views (per pixel: over those that saw it). 1 weighs every view the same (2 views
    with flip alone, 3 with translate alone, 6 with both); 0.5 with flip and translate gives
    the CIFAR-10 speed record's (airbench94) 0.25 to each unshifted view, 0.125 to each shifted.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        flip: bool,
        translate: int,
        average: str,
        translate_weight: float = 1.0,
    ) -> None:
        super().__init__()
        self.model, self.flip, self.translate, self.average = model, flip, translate, average
        self.translate_weight = translate_weight

    def transforms(self, images: torch.Tensor) -> list[tuple[bool, int]]:
        """(mirrored, shift) of each view: shift > 0 moves the content down-right, < 0 up-left."""
        if images.dim() != 4:
            raise DataError(
                f"trainer.tta_flip / tta_translate: need batches of images (B, C, H, W), got "
                f"inputs of shape {tuple(images.shape)}"
            )
        height, width = images.shape[-2:]
        if self.translate >= min(height, width):  # reflect padding mirrors size - 1 at most
            raise DataError(
                f"trainer.tta_translate: {self.translate} pixels must be less than the images' "
                f"height and width, got images of {height} x {width}"
            )
        flips = [False, True] if self.flip else [False]
        shifts = [0, -self.translate, self.translate] if self.translate else [0]
        return [(mirrored, shift) for mirrored in flips for shift in shifts]

    def forward(self, images: torch.Tensor, *more: object, **named: object) -> torch.Tensor:
        # Views of the images alone: what else a step hands the model (a detector's targets,
        # whose boxes a view would move) cannot be made into views here, so it is refused.
        if more or named:
            raise DataError(
                "trainer.tta_flip / tta_translate: average model(images) over views, but the "
                f"step calls the model with {len(more) + len(named) + 1} arguments; turn "
                "test-time augmentation off"
            )
        outputs, masks, weights = [], [], []
        for mirrored, shift in self.transforms(images):
            view = images.flip(-1) if mirrored else images
            output = self.model(move(view, shift))
            if not isinstance(output, torch.Tensor):
                raise DataError(
                    "trainer.tta_flip / tta_translate: the model's output is a "
                    f"{type(output).__name__}, not a tensor: its views cannot be averaged; turn "
                    "test-time augmentation off"
                )
            output = output.float()
            output, mask = self.back(output, images, mirrored, shift)
            outputs.append(output)
            masks.append(mask)
            weights.append(self.translate_weight if shift else 1.0)
        outputs = torch.stack(outputs)  # (V, B, ...)
        seen = torch.stack(masks)  # (V, 1, 1, H, W), or (V, 1, 1) for outputs (B, K)
        # Each view's weight where it saw the pixel, 0 elsewhere: with weight 1 this is `seen`
        # itself (x 1.0 is exact), so the default computes what equal weights always did.
        weight = seen * seen.new_tensor(weights).view(-1, *[1] * (seen.dim() - 1))
        total = weight.sum(dim=0)  # > 0 everywhere: the plain view saw every pixel
        if self.average == "logits":
            return (outputs * weight).sum(dim=0) / total
        if outputs.dim() < 3 or outputs.shape[2] < 2:  # one score: its softmax is always 1
            raise DataError(
                'trainer.tta_average "probabilities": needs class scores (B, K) or (B, K, H, W) '
                f"with K >= 2, got outputs of shape {tuple(outputs.shape[1:])}"
            )
        # log(sum of weight x probability): the weight enters as its log (0 for weight 1),
        # and the views that did not see a pixel as -inf (weight 0).
        log_probabilities = outputs.log_softmax(dim=2) + weight.log()
        return torch.logsumexp(log_probabilities, dim=0) - total.log()

    def back(
        self, output: torch.Tensor, images: torch.Tensor, mirrored: bool, shift: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A view's output on the input's pixels, and where it has them (a 0/1 mask)."""
        if output.dim() <= 2:  # one output per image: nothing to map back
            return output, output.new_ones((1,) * output.dim())
        dense = (
            output.dim() == 4
            and output.shape[0] == images.shape[0]
            and output.shape[-2:] == images.shape[-2:]
        )
        if not dense:
            raise DataError(
                f"trainer.tta_flip / tta_translate: the model's output {tuple(output.shape)} is "
                "neither one output per image (B, K) nor one per pixel of the input "
                f"{tuple(images.shape)} (B, C, H, W): its views cannot be mapped back; turn "
                "test-time augmentation off"
            )
        # The view's pixel (i + shift, j + shift) is the input's (i, j): shift it back, zeros
        # (and a 0 in the mask) where the view had none of the input's pixels.
        mask = move(output.new_ones(1, 1, *output.shape[-2:]), -shift, edges="zeros")
        output = move(output, -shift, edges="zeros")
        return (output.flip(-1), mask.flip(-1)) if mirrored else (output, mask)


def move(images: torch.Tensor, shift: int, edges: str = "reflect") -> torch.Tensor:
    """images (..., H, W) with their content moved `shift` pixels down and right (negative: up
    and left); the rows and columns that come in are mirrored edges or zeros (`edges`)."""
    if shift == 0:
        return images
    size = abs(shift)
    height, width = images.shape[-2:]
    mode = "reflect" if edges == "reflect" else "constant"
    padded = functional.pad(images, (size,) * 4, mode=mode)  # (..., H + 2s, W + 2s)
    start = size - shift  # 0 moves the content down-right, 2s up-left
    return padded[..., start : start + height, start : start + width]


def as_evaluated(model: nn.Module, options: dict) -> nn.Module:
    """`model` as validation and test.py run it, for predict.py and export.py: averaged over the
    views the trainer options (config "trainer") name with tta_*, or `model` itself without them."""
    if not (options["tta_flip"] or options["tta_translate"]):
        return model
    return AverageOverViews(
        model,
        flip=options["tta_flip"],
        translate=options["tta_translate"],
        average=options["tta_average"],
        translate_weight=options["tta_translate_weight"],
    ).eval()

"""Loss functions a config can name in "loss": (output, target) -> the batch's mean loss."""

import torch
import torch.nn.functional as F

__all__ = ["cross_entropy", "mse_loss", "nll_loss"]


def cross_entropy(
    output: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Softmax cross-entropy on logits (B, C), against class indices (B,) or, after MixUp or
    CutMix, class probabilities (B, C); label_smoothing mixes a uniform distribution into the
    target ({"type": "cross_entropy", "args": {"label_smoothing": 0.1}})."""
    return F.cross_entropy(output, target, label_smoothing=label_smoothing)


def nll_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood; the model must output log-probabilities."""
    return F.nll_loss(output, target)


def mse_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error, e.g. between a denoised and a clean image, both (B, C, H, W)."""
    return F.mse_loss(output, target)

"""Loss functions a config can name in "loss": (logits (B, C), targets (B,)) -> mean loss."""

import torch
import torch.nn.functional as F

__all__ = ["cross_entropy", "nll_loss"]


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Softmax cross-entropy on logits."""
    return F.cross_entropy(output, target)


def nll_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood; the model must output log-probabilities."""
    return F.nll_loss(output, target)

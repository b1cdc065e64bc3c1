"""Metrics a config can name in "metrics".

A metric returns the SUM of a per-sample score over the batch, as a 0-d tensor on the
batch's device. The trainer adds these sums and divides by the number of samples at the
end of the epoch, so every sample weighs the same however the batches are cut (a short
last batch does not count as much as a full one) and nothing syncs with the host per step.
"""

import torch

__all__ = ["accuracy", "psnr", "top_5_acc", "top_k_acc"]


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

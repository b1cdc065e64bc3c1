"""Loss functions a config can name in "loss": (output, target) -> the batch's mean loss."""

import torch
import torch.nn.functional as F

__all__ = ["cross_entropy", "mse_loss", "nll_loss", "sum_of_losses"]


def cross_entropy(
    output: torch.Tensor,
    target: torch.Tensor,
    label_smoothing: float = 0.0,
    ignore_index: int | None = None,
) -> torch.Tensor:
    """Softmax cross-entropy on logits (B, C, ...), against class indices (B, ...) or, after
    MixUp or CutMix, class probabilities (B, C); label_smoothing mixes a uniform distribution into
    the target ({"type": "cross_entropy", "args": {"label_smoothing": 0.1}}). ignore_index (by
    default the data's, data_loader.args.ignore_index): see mean_per_sample."""
    if ignore_index is None or target.is_floating_point():
        return F.cross_entropy(output, target, label_smoothing=label_smoothing)
    losses = F.cross_entropy(
        output, target, label_smoothing=label_smoothing, ignore_index=ignore_index, reduction="none"
    )
    return mean_per_sample(losses, target, ignore_index)


def nll_loss(
    output: torch.Tensor, target: torch.Tensor, ignore_index: int | None = None
) -> torch.Tensor:
    """Negative log-likelihood; the model must output log-probabilities. ignore_index: as
    cross_entropy's."""
    if ignore_index is None:
        return F.nll_loss(output, target)
    losses = F.nll_loss(output, target, ignore_index=ignore_index, reduction="none")
    return mean_per_sample(losses, target, ignore_index)


def mean_per_sample(losses: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """The batch's mean of each sample's mean loss over its elements whose target is not
    ignore_index (a mask's void pixels): losses (B, ...) with those elements 0, target (B, ...).

    Torch's own mean weighs the batch's labelled elements alike, so a batch's loss would depend
    on which images share it; per sample, the engine's sum of loss x batch size over an epoch is
    the same however the batches are cut (val/loss stays exact). A sample with no labelled
    element adds 0 (and counts as a sample)."""
    labelled = (target != ignore_index).reshape(len(target), -1).sum(dim=1)  # (B,)
    return (losses.reshape(len(losses), -1).sum(dim=1) / labelled.clamp_min(1)).mean()


def mse_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error between two tensors of one shape: a denoised and a clean image, both
    (B, C, H, W), or a regression's predictions and targets, (B, 1) and (B, 1)."""
    same_shape(output, target, "mse_loss")
    return F.mse_loss(output, target)


def same_shape(output: torch.Tensor, target: torch.Tensor, name: str) -> None:
    """Refuse an output and a target of other shapes, which would broadcast: (B, 1) against (B,)
    is a (B, B) comparison, a loss that trains and learns nothing. A loss of your own can call
    it too; the first batch's check reports the ValueError in one line."""
    if output.shape != target.shape:
        raise ValueError(
            f"{name}: the output {tuple(output.shape)} and the target {tuple(target.shape)} "
            "differ in shape and would broadcast; give the target the output's shape (for one "
            "value a sample: targets (B, 1), e.g. target.unsqueeze(1) in the dataset)"
        )


def sum_of_losses(output: dict[str, torch.Tensor], target: object) -> torch.Tensor:
    """The sum of a dict of named 0-d losses: a model that computes its own losses (a detector's,
    model/detector.py) returns them as `output`; `target` is not read again."""
    if not isinstance(output, dict) or not output:
        raise ValueError(
            f"sum_of_losses: the output is a {type(output).__name__}, not a dict of losses; "
            "a model that returns its own losses returns {name: 0-d tensor}"
        )
    return torch.stack(list(output.values())).sum()

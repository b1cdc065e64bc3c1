"""TensorBoard output that costs nothing when it is turned off (or on ranks other than 0)."""

from pathlib import Path

import torch


class TensorboardWriter:
    """A thin wrapper over SummaryWriter; every method is a no-op when disabled.

    TensorBoard is imported only when enabled: it adds about a second to start-up.
    """

    def __init__(self, log_dir: Path, enabled: bool) -> None:
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(log_dir))

    @property
    def enabled(self) -> bool:
        return self.writer is not None

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        if self.writer is not None:
            self.writer.add_scalar(tag, value, step)

    def add_scalars(self, values: dict[str, float], step: int) -> None:
        """One scalar per key, e.g. {"train/loss": 0.5, "val/accuracy": 0.9}."""
        for tag, value in values.items():
            self.add_scalar(tag, value, step)

    def add_image(self, tag: str, image: torch.Tensor, step: int) -> None:
        """image: (C, H, W) floats in [0, 1], e.g. a torchvision.utils.make_grid of a batch."""
        if self.writer is not None:
            self.writer.add_image(tag, image, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

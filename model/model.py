"""Models a config can name in arch.type."""

import torch
import torchvision
from torch import nn

from base import BaseModel

__all__ = ["CifarCNN", "TorchvisionModel"]


class CifarCNN(BaseModel):
    """Blocks of (Conv3x3-BatchNorm-ReLU) x convs_per_block + MaxPool, then a linear head.

    The head's in_features follows from in_shape, widths and the number of blocks,
    so changing any of them in config still builds.
    """

    def __init__(
        self,
        *,
        in_shape: tuple[int, int, int] | list[int] = (3, 32, 32),
        num_classes: int = 10,
        widths: list[int] | tuple[int, ...] = (64, 128, 256),
        convs_per_block: int = 2,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        channels, height, width = in_shape
        # Each block halves the spatial size (floor), as MaxPool2d(2) does.
        out_height, out_width = height // 2 ** len(widths), width // 2 ** len(widths)
        if out_height == 0 or out_width == 0:
            raise ValueError(
                f"in_shape {list(in_shape)} is too small for {len(widths)} blocks "
                f"(each halves the image); use fewer widths or larger images"
            )
        layers: list[nn.Module] = []
        for out_channels in widths:
            for _ in range(convs_per_block):
                layers += [
                    # No conv bias: the BatchNorm right after it has its own.
                    nn.Conv2d(channels, out_channels, kernel_size=3, padding=1, bias=False),
                    nn.BatchNorm2d(out_channels),
                    nn.ReLU(inplace=True),
                ]
                channels = out_channels
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(channels * out_height * out_width, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.features(images)  # (B, C, H / 2^blocks, W / 2^blocks)
        return self.head(self.dropout(torch.flatten(features, 1)))  # (B, num_classes) logits


class TorchvisionModel(BaseModel):
    """Any torchvision.models architecture by name, e.g. {"name": "resnet50", "num_classes": 1000}."""

    def __init__(self, name: str, *, num_classes: int = 1000, weights: str | None = None) -> None:
        super().__init__()
        available = torchvision.models.list_models()
        if name not in available:
            raise ValueError(
                f"unknown torchvision model {name!r}; see torchvision.models.list_models()"
            )
        self.network = torchvision.models.get_model(name, weights=weights, num_classes=num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.network(images)

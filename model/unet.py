"""A small U-Net (Ronneberger et al., 2015) for semantic segmentation (configs/segmentation.json):
per-pixel class logits, fully convolutional, so any height and width its stride divides."""

import torch
from torch import nn

from base import BaseModel
from utils import ConfigValueError


def double_conv(in_channels: int, out_channels: int) -> nn.Sequential:
    """(Conv3x3-BatchNorm-ReLU) x 2 at one resolution; no conv bias before a BatchNorm."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
        nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class UNet(BaseModel):
    """Encoder of len(widths) levels, each halving H and W after the first (max pooling); a
    decoder that doubles them back (transposed convolution) and joins the encoder's features of
    the same size (skip connections); a 1x1 convolution to num_classes logits per pixel.

    Input (B, in_channels, H, W) with H and W multiples of `stride` (2^(levels - 1)); output
    (B, num_classes, H, W).
    """

    def __init__(
        self,
        *,
        num_classes: int,
        in_channels: int = 3,
        widths: list[int] | tuple[int, ...] = (16, 32, 64),
    ) -> None:
        super().__init__()
        if not (isinstance(num_classes, int) and num_classes >= 2):
            raise ConfigValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        if not (
            isinstance(widths, list | tuple)
            and len(widths) >= 2
            and all(isinstance(width, int) and width > 0 for width in widths)
        ):
            raise ConfigValueError(
                f"widths must be a list of at least 2 positive integers, got {widths!r}"
            )
        self.num_classes = num_classes  # the trainer checks the masks' classes against it
        self.stride = 2 ** (len(widths) - 1)
        self.down = nn.ModuleList()
        channels = in_channels
        for width in widths:
            self.down.append(double_conv(channels, width))
            channels = width
        self.pool = nn.MaxPool2d(2)
        self.upsample = nn.ModuleList()
        self.up = nn.ModuleList()
        for width in reversed(widths[:-1]):
            self.upsample.append(nn.ConvTranspose2d(channels, width, 2, stride=2))
            self.up.append(double_conv(2 * width, width))  # upsampled + skip, concatenated
            channels = width
        self.head = nn.Conv2d(channels, num_classes, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.shape[-2] % self.stride or images.shape[-1] % self.stride:
            raise ValueError(
                f"UNet: height and width must be multiples of {self.stride} (2^(levels - 1)); "
                f"got images of shape {tuple(images.shape)}"
            )
        skips = []
        features = images  # (B, in_channels, H, W)
        for level, block in enumerate(self.down):
            if level:
                features = self.pool(features)  # (B, C, H / 2^level, W / 2^level)
            features = block(features)
            skips.append(features)
        skips.pop()  # the deepest level is the decoder's start, not a skip
        for upsample, block in zip(self.upsample, self.up, strict=True):
            features = upsample(features)  # twice the size, as the skip of that level
            features = block(torch.cat([features, skips.pop()], dim=1))
        return self.head(features)  # (B, num_classes, H, W) logits

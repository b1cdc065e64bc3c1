"""FastCifarCNN: the network of the fast CIFAR-10 recipe (config.json).

Its design follows the public CIFAR-10 speed records (airbench, hlb-CIFAR10): a small network
whose first layer whitens 2x2 patches with statistics of training images, three blocks that
halve the image, BatchNorm with a short memory, convolutions that start as identities, and a
linear head whose logits are scaled down. docs/recipes.md has the recipe and its figures.
"""

import torch
from torch import nn

from base import BaseModel
from utils import ConfigValueError


class ConvBlock(nn.Sequential):
    """conv3x3 - max-pool 2 - BatchNorm - GELU - conv3x3 - BatchNorm - GELU: (B, C_in, H, W) ->
    (B, C_out, H // 2, W // 2). Pooling before the first normalisation is a quarter of its work.
    """

    def __init__(self, in_channels: int, out_channels: int, momentum: float, eps: float) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
            nn.MaxPool2d(2),
            nn.BatchNorm2d(out_channels, momentum=momentum, eps=eps),
            nn.GELU(),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels, momentum=momentum, eps=eps),
            nn.GELU(),
        )
        for conv in (self[0], self[4]):
            # The first in_channels filters pass their input through (torch's dirac_): at the
            # start each block is close to an identity plus noise, which trains fast.
            torch.nn.init.dirac_(conv.weight[: conv.in_channels])


class FastCifarCNN(BaseModel):
    """A 2x2 whitening convolution (2 x C x 4 filters, fitted by fit_data, not trained), GELU,
    one ConvBlock per width, a global max pool and a bias-free linear head whose logits are
    multiplied by head_scale. BatchNorm momentum and eps are torch's (momentum 0.4: the running
    statistics follow the last few batches, which matters with few, large batches).

    in_shape (C, H, W); whiten_samples: the training images the whitening is fitted on;
    whiten_eps: added to the patch covariance's eigenvalues (the whitening of a direction
    without variance stays finite).
    """

    def __init__(
        self,
        *,
        in_shape: tuple[int, int, int] | list[int] = (3, 32, 32),
        num_classes: int = 10,
        widths: list[int] | tuple[int, ...] = (64, 256, 256),
        norm_momentum: float = 0.4,
        norm_eps: float = 1e-12,
        head_scale: float = 1 / 9,
        whiten_samples: int = 5000,
        whiten_eps: float = 5e-4,
    ) -> None:
        super().__init__()
        if not (isinstance(in_shape, list | tuple) and len(in_shape) == 3):
            raise ConfigValueError(f"in_shape must be [channels, height, width], got {in_shape!r}")
        if not (
            isinstance(widths, list | tuple) and widths and all(_positive_int(w) for w in widths)
        ):
            raise ConfigValueError(
                f"widths must be a non-empty list of positive integers, got {widths!r}"
            )
        # JSON's 10.0 (or 10.5) would fail inside nn.Linear, with a traceback.
        if not _positive_int(num_classes):
            raise ConfigValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
        channels, height, width = in_shape
        if min(height, width) - 1 < 2 ** len(widths):
            raise ConfigValueError(
                f"in_shape {list(in_shape)} is too small for {len(widths)} blocks (each halves "
                "the image)"
            )
        self.num_classes, self.head_scale = num_classes, head_scale
        self.whiten_samples, self.whiten_eps = whiten_samples, whiten_eps
        # (B, C, H, W) -> (B, 8C, H - 1, W - 1): every 2x2 patch projected on the eigenvectors
        # of the patches' covariance, scaled to unit variance, with and without sign.
        self.whiten = nn.Conv2d(channels, 2 * channels * 4, kernel_size=2, padding=0, bias=True)
        self.whiten.weight.requires_grad_(False)  # fitted, not trained (its bias trains)
        blocks, previous = [], self.whiten.out_channels
        for out_channels in widths:
            blocks.append(ConvBlock(previous, out_channels, norm_momentum, norm_eps))
            previous = out_channels
        self.features = nn.Sequential(nn.GELU(), *blocks)
        self.head = nn.Linear(previous, num_classes, bias=False)

    @torch.no_grad()
    def fit_data(self, data: "object") -> None:
        """The whitening filters from whiten_samples training images, as the model sees them
        in evaluation (normalised; never validation or test data)."""
        samples = data.training_samples(self.whiten_samples, transformed=True)
        images = torch.stack([image for image, _ in samples]).float()  # (N, C, H, W)
        channels = images.shape[1]
        # Every 2x2 patch of every image as a vector of C x 4 values: (N * (H-1) * (W-1), 4C).
        patches = images.unfold(2, 2, 1).unfold(3, 2, 1)  # (N, C, H-1, W-1, 2, 2)
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, channels * 4).double()
        patches = patches - patches.mean(dim=0)
        covariance = patches.T @ patches / len(patches)  # (4C, 4C)
        eigenvalues, eigenvectors = torch.linalg.eigh(covariance)  # ascending
        filters = eigenvectors.T / torch.sqrt(eigenvalues + self.whiten_eps).unsqueeze(1)
        filters = filters.flip(0).reshape(-1, channels, 2, 2)  # largest variance first
        self.whiten.weight.copy_(torch.cat([filters, -filters]).to(self.whiten.weight.dtype))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.features(self.whiten(images))  # (B, widths[-1], h, w)
        pooled = torch.amax(features, dim=(2, 3))  # (B, widths[-1])
        return self.head(pooled) * self.head_scale  # (B, num_classes) logits


def _positive_int(value: object) -> bool:
    return type(value) is int and value > 0  # bool is no count

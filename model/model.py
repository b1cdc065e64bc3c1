"""Models a config can name in arch.type."""

from typing import Any

import torch
from torch import nn

from base import BaseModel
from model.detector import TinyDetector  # in __all__ too
from model.fast_cifar import FastCifarCNN  # in __all__: configs name it here
from model.sequence import GRUClassifier  # in __all__ too
from model.torchvision_model import TorchvisionModel  # in __all__ too
from model.unet import UNet  # in __all__ too
from utils import ConfigValueError
from utils.util import is_number

__all__ = [
    "CifarCNN",
    "DenoisingCNN",
    "FastCifarCNN",
    "GRUClassifier",
    "TabularMLP",
    "TinyDetector",
    "TorchvisionModel",
    "UNet",
]


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
        if not (
            isinstance(widths, list | tuple) and widths and all(_positive_int(w) for w in widths)
        ):
            raise ConfigValueError(
                f"widths must be a non-empty list of positive integers, got {widths!r}"
            )
        if not (isinstance(in_shape, list | tuple) and len(in_shape) == 3):
            raise ConfigValueError(f"in_shape must be [channels, height, width], got {in_shape!r}")
        # JSON's 10.0 (or 10.5) would fail inside nn.Linear, with a traceback.
        if not _positive_int(num_classes):
            raise ConfigValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
        channels, height, width = in_shape
        # Each block halves the spatial size (floor), as MaxPool2d(2) does.
        out_height, out_width = height // 2 ** len(widths), width // 2 ** len(widths)
        if out_height == 0 or out_width == 0:
            raise ConfigValueError(
                f"in_shape {list(in_shape)} is too small for {len(widths)} blocks "
                f"(each halves the image); use fewer widths or larger images"
            )
        blocks: list[nn.Module] = []
        for out_channels in widths:
            layers: list[nn.Module] = []
            for _ in range(convs_per_block):
                layers += [
                    # No conv bias: the BatchNorm right after it has its own.
                    nn.Conv2d(channels, out_channels, kernel_size=3, padding=1, bias=False),
                    nn.BatchNorm2d(out_channels),
                    nn.ReLU(inplace=True),
                ]
                channels = out_channels
            blocks.append(nn.Sequential(*layers, nn.MaxPool2d(2)))
        self.features = nn.Sequential(*blocks)  # the blocks FSDP shards one by one (blocks())
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(channels * out_height * out_width, num_classes)
        self.num_classes = num_classes  # the trainer checks the data's labels against it

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.features(images)  # (B, C, H / 2^blocks, W / 2^blocks)
        return self.head(self.dropout(torch.flatten(features, 1)))  # (B, num_classes) logits


class DenoisingCNN(BaseModel):
    """Noisy image in, clean image out (configs/denoise.json): a stack of 3x3 convolutions at
    full resolution predicts the noise, which is subtracted from the input (DnCNN's residual
    learning: the network learns the small correction, not the whole image)."""

    def __init__(self, *, channels: int = 3, width: int = 32, depth: int = 4) -> None:
        super().__init__()
        if not (_positive_int(channels) and _positive_int(width) and _positive_int(depth)):
            raise ConfigValueError(
                f"channels, width and depth must be positive integers, got {channels}, {width}, "
                f"{depth}"
            )
        layers: list[nn.Module] = [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(inplace=True)]
        for _ in range(depth):
            layers += [
                nn.Conv2d(width, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
            ]
        layers.append(nn.Conv2d(width, channels, 3, padding=1))
        self.noise = nn.Sequential(*layers)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images - self.noise(images)  # (B, C, H, W), the input's size


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


class TabularMLP(BaseModel):
    """Rows of numbers (B, in_features) -> (B, 1) for a regression (num_classes null), logits
    (B, num_classes) for a classifier: the inputs standardised, `hidden` layers of ReLU (with
    dropout), a linear output; a regression's output in its target's units.

    The statistics come from the training split (fit_data, before training), in buffers that
    checkpoints keep: predict.py and export.py need nothing else.
    """

    def __init__(
        self,
        *,
        in_features: int,
        hidden: list[int] | None = None,
        num_classes: int | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if not (isinstance(in_features, int) and in_features > 0):
            raise ConfigValueError(f"in_features must be a positive integer, got {in_features!r}")
        hidden = [64, 64] if hidden is None else hidden
        if not (isinstance(hidden, list | tuple) and all(_positive_int(size) for size in hidden)):
            raise ConfigValueError(
                f"hidden must be a list of positive integers (the hidden layers' widths), got "
                f"{hidden!r}"
            )
        # num_classes 1 would be a classifier of one class: its target left unstandardised.
        if num_classes is not None and not (_positive_int(num_classes) and num_classes >= 2):
            raise ConfigValueError(
                f"num_classes must be at least 2 (a classifier), or null for a regression (one "
                f"output), got {num_classes!r}"
            )
        if not (is_number(dropout) and 0 <= dropout < 1):
            raise ConfigValueError(f"dropout must be a fraction in [0, 1), got {dropout!r}")
        self.in_features = in_features
        if num_classes is not None:
            self.num_classes = num_classes  # a classifier: the Trainer checks the labels
        layers: list[nn.Module] = []
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU(), nn.Dropout(dropout)]
            width = size
        self.network = nn.Sequential(*layers, nn.Linear(width, num_classes or 1))
        self.register_buffer("input_mean", torch.zeros(in_features))
        self.register_buffer("input_std", torch.ones(in_features))
        self.register_buffer("target_mean", torch.zeros(1))
        self.register_buffer("target_std", torch.ones(1))

    def fit_data(self, data: Any) -> None:
        """Mean and standard deviation of every feature (and a regression's target) over the
        training split: inputs and outputs then start near 0 and 1 whatever their units."""
        samples = data.training_samples()
        # float64: float32 sums round, and a column of 10000.1 would vary by 0.002.
        features = torch.stack([features for features, _ in samples]).double()  # (N, F)
        if features.shape[1] != self.in_features:
            raise ConfigValueError(
                f"in_features is {self.in_features}, but the data has {features.shape[1]} "
                f"features: set arch.args.in_features to {features.shape[1]}"
            )
        self.input_mean.copy_(features.mean(dim=0))
        self.input_std.copy_(spread(features))
        if not hasattr(self, "num_classes"):
            targets = torch.stack([torch.as_tensor(target) for _, target in samples]).double()
            targets = targets.reshape(-1, 1)  # (N, 1)
            self.target_mean.copy_(targets.mean(dim=0))
            self.target_std.copy_(spread(targets))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        output = self.network((inputs - self.input_mean) / self.input_std)
        if hasattr(self, "num_classes"):
            return output  # logits (B, num_classes)
        return output * self.target_std + self.target_mean  # (B, 1) in the target's units


def spread(values: torch.Tensor) -> torch.Tensor:
    """The standard deviation of each column of values (N, K) over its rows; 1 for a column
    constant there, which is centred and left unscaled (as scikit-learn's StandardScaler does):
    a new value in it is not multiplied by the inverse of a rounding error."""
    constant = (values == values[0]).all(dim=0)  # (K,)
    return torch.where(constant, torch.ones_like(constant, dtype=values.dtype), values.std(dim=0))

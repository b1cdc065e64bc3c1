"""Transform presets: image (PIL or HWC uint8 array) -> normalised CHW float tensor."""

from collections.abc import Callable

import torch
from torchvision.transforms import v2

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def cifar_transform(augment: bool, image_size: int = 32) -> Callable:
    """CIFAR-10 recipe: random crop with 4-pixel padding and horizontal flip when augmenting."""
    # HWC uint8 (array or PIL) -> CHW uint8 tensor, at image_size (a no-op for 32x32 CIFAR).
    steps: list[Callable] = [v2.ToImage(), v2.Resize((image_size, image_size), antialias=True)]
    if augment:
        steps += [v2.RandomCrop(image_size, padding=4), v2.RandomHorizontalFlip()]
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(CIFAR10_MEAN, CIFAR10_STD)]
    return v2.Compose(steps)


def imagenet_transform(augment: bool, image_size: int = 224) -> Callable:
    """ImageNet recipe: RandomResizedCrop + flip for training; Resize + CenterCrop for evaluation."""
    steps: list[Callable] = [v2.ToImage()]
    if augment:
        steps += [v2.RandomResizedCrop(image_size, antialias=True), v2.RandomHorizontalFlip()]
    else:
        # The usual 256 -> 224 ratio, kept for other sizes.
        steps += [
            v2.Resize(round(image_size * 256 / 224), antialias=True),
            v2.CenterCrop(image_size),
        ]
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    return v2.Compose(steps)


PRESETS: dict[str, Callable[[bool, int], Callable]] = {
    "cifar": cifar_transform,
    "imagenet": imagenet_transform,
}

# (mean, std) per preset: the TensorBoard image grid undoes the normalisation with these.
STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar": (CIFAR10_MEAN, CIFAR10_STD),
    "imagenet": (IMAGENET_MEAN, IMAGENET_STD),
}

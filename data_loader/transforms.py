"""Transform presets: image (PIL or HWC uint8 array) -> normalised CHW float tensor."""

import inspect
from collections.abc import Callable

import torch
from torchvision.transforms import v2

from utils import ConfigValueError

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

# The image size of each preset when data_loader.args.image_size is not set.
IMAGE_SIZES = {"cifar": 32, "imagenet": 224}


def preset_transform(preset: str, augment: bool, image_size: int | None = None) -> Callable:
    """The transform of `preset` at image_size (default: the preset's own, IMAGE_SIZES)."""
    if preset not in PRESETS:
        raise ConfigValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[preset](augment, image_size or IMAGE_SIZES[preset])


def evaluation_transform(loader_class: type, loader_args: dict) -> Callable:
    """The evaluation transform of data_loader.type `loader_class` with data_loader.args, built
    without reading any data (predict.py and export.py have only the checkpoint): the class's
    `preset`, or args.preset (ImageFolderDataLoader), at args.image_size."""
    preset = loader_args.get("preset", getattr(loader_class, "preset", None))
    if preset is None:
        raise ConfigValueError(
            f"{loader_class.__name__} names no transform preset, so its inputs cannot be rebuilt "
            "from the config alone; set its class attribute `preset` (data_loader/transforms.py)"
        )
    if preset not in PRESETS:
        raise ConfigValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    build = PRESETS[preset]
    # Every data_loader.args key the preset takes (image_size, and any size option a preset
    # gains), so that the transform is the run's own and not the preset's defaults.
    options = {
        name: loader_args[name]
        for name in inspect.signature(build).parameters
        if name != "augment" and name in loader_args
    }
    options["image_size"] = options.get("image_size") or IMAGE_SIZES[preset]
    return build(False, **options)

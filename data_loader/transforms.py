"""Transform presets: image (PIL or HWC uint8 array) -> normalised CHW float tensor, and the
batch mixing (MixUp / CutMix) of training batches."""

import inspect
from collections.abc import Callable

import torch
from torchvision.transforms import v2

from data_loader.device_augment import (
    DeviceAutoAugment,
    DeviceRandAugment,
    DeviceTrivialAugmentWide,
)
from utils import ConfigValueError

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# data_loader.args.auto_augment: torchvision's augmentation policies (their default settings).
AUTO_AUGMENT = ("trivialaugment", "randaugment", "autoaugment")
# data_loader.args.flip: horizontal flips of training images: each drawn at random, each sample
# flipped in every other pass (utils/data/sampler.py's alternating_flips), or none.
FLIPS = ("random", "alternating", "none")
# data_loader.args.padding_mode (preset "cifar"): what the random crop's padding shows.
PADDING_MODES = ("constant", "reflect")


def augmentation_policy(
    name: str | None, preset: str, *, on_device: bool = False
) -> list[Callable]:
    """The policy `name` as a list of one transform (of uint8 images), or none. on_device: its
    variant for images on the training device, the same draws and images without a host sync
    per image (data_loader/device_augment.py)."""
    if name is None:
        return []
    if name == "trivialaugment":
        return [DeviceTrivialAugmentWide() if on_device else v2.TrivialAugmentWide()]
    if name == "randaugment":
        return [DeviceRandAugment() if on_device else v2.RandAugment()]
    policy = v2.AutoAugmentPolicy.CIFAR10 if preset == "cifar" else v2.AutoAugmentPolicy.IMAGENET
    return [DeviceAutoAugment(policy) if on_device else v2.AutoAugment(policy)]


def cifar_transform(
    augment: bool,
    *,
    image_size: int = 32,
    eval_image_size: int | None = None,
    auto_augment: str | None = None,
    random_erasing: float = 0.0,
    crop_padding: int = 4,
    padding_mode: str = "constant",
    flip: str = "random",
) -> Callable:
    """CIFAR-10 recipe: a random crop of the image padded by crop_padding pixels (zeros, or
    mirrored: padding_mode "reflect"; 0: no crop) and a random horizontal flip (flip "random";
    "alternating" flips outside the transform, TransformedDataset) when augmenting, then the
    auto_augment policy, normalisation and random erasing (with that probability)."""
    size = image_size if augment else eval_image_size or image_size
    # HWC uint8 (array or PIL) -> CHW uint8 tensor, at size (a no-op for 32x32 CIFAR).
    steps: list[Callable] = [v2.ToImage(), v2.Resize((size, size), antialias=True)]
    if augment:
        if crop_padding:
            steps.append(v2.RandomCrop(size, padding=crop_padding, padding_mode=padding_mode))
        steps += [v2.RandomHorizontalFlip()] if flip == "random" else []
        steps += augmentation_policy(auto_augment, "cifar")
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(CIFAR10_MEAN, CIFAR10_STD)]
    if augment and random_erasing > 0:
        steps.append(v2.RandomErasing(p=random_erasing))
    return v2.Compose(steps)


def imagenet_transform(
    augment: bool,
    *,
    image_size: int = 224,
    eval_image_size: int | None = None,
    eval_resize_size: int | None = None,
    auto_augment: str | None = None,
    random_erasing: float = 0.0,
    flip: str = "random",
) -> Callable:
    """ImageNet recipe: RandomResizedCrop(image_size) + flip (+ auto_augment, random erasing) for
    training; Resize(eval_resize_size) + CenterCrop(eval_image_size) for evaluation. Training
    smaller than evaluating (176 vs 232 -> 224) makes up for the objects RandomResizedCrop
    enlarges (FixRes, Touvron et al., 2019)."""
    steps: list[Callable] = [v2.ToImage()]
    if augment:
        steps.append(v2.RandomResizedCrop(image_size, antialias=True))
        steps += [v2.RandomHorizontalFlip()] if flip == "random" else []
        steps += augmentation_policy(auto_augment, "imagenet")
    else:
        crop = eval_image_size or image_size
        # The usual 256 -> 224 ratio unless eval_resize_size says otherwise.
        resize = eval_resize_size or round(crop * 256 / 224)
        steps += [v2.Resize(resize, antialias=True), v2.CenterCrop(crop)]
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    if augment and random_erasing > 0:
        steps.append(v2.RandomErasing(p=random_erasing))
    return v2.Compose(steps)


PRESETS: dict[str, Callable[..., Callable]] = {
    "cifar": cifar_transform,
    "imagenet": imagenet_transform,
}
# The training image size of each preset unless image_size says otherwise.
IMAGE_SIZES = {"cifar": 32, "imagenet": 224}

# (mean, std) per preset: the TensorBoard image grid undoes the normalisation with these.
STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar": (CIFAR10_MEAN, CIFAR10_STD),
    "imagenet": (IMAGENET_MEAN, IMAGENET_STD),
}


def no_mixing(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch as it is: batch_mixing when MixUp and CutMix are off."""
    return images, labels


def batch_mixing(
    num_classes: int | None,
    *,
    mixup_alpha: float = 0.0,
    cutmix_alpha: float = 0.0,
    prob: float = 1.0,
    cutmix_prob: float = 0.5,
) -> Callable:
    """(images (B, C, H, W), labels (B,)) -> (mixed images, soft labels (B, num_classes)) with
    torchvision's MixUp and/or CutMix (config batch_mixing); no_mixing when both are off.

    Each mixes the batch with itself rolled by one, by a factor drawn from Beta(alpha, alpha)
    on the CPU's generator (seeded per epoch; no device sync).
    """
    if not num_classes and (mixup_alpha > 0 or cutmix_alpha > 0):
        raise ConfigValueError("batch_mixing: needs a classifier (a model with num_classes)")
    mixers, weights = [], []
    if mixup_alpha > 0:
        mixers.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
        weights.append(1 - cutmix_prob if cutmix_alpha > 0 else 1.0)
    if cutmix_alpha > 0:
        mixers.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
        weights.append(cutmix_prob if mixup_alpha > 0 else 1.0)
    if not mixers:
        return no_mixing
    mix = mixers[0] if len(mixers) == 1 else v2.RandomChoice(mixers, p=weights)
    return mix if prob == 1 else v2.RandomApply([mix], p=prob)


def preset_transform(preset: str, augment: bool, options: dict) -> Callable:
    """The transform of `preset` for training (augment) or evaluation, with the data_loader.args
    options it takes (image_size, eval_image_size, eval_resize_size, auto_augment,
    random_erasing, crop_padding, padding_mode, flip; unset ones keep the preset's defaults): what the loaders apply and what
    predict.py and export.py rebuild without any data."""
    if preset not in PRESETS:
        raise ConfigValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    build = PRESETS[preset]
    chosen = {
        name: options[name]
        for name in inspect.signature(build).parameters
        if name != "augment" and options.get(name) is not None
    }
    chosen["image_size"] = chosen.get("image_size") or IMAGE_SIZES[preset]
    return build(augment, **chosen)


def evaluation_transform(loader_class: type, loader_args: dict) -> Callable:
    """The evaluation transform of data_loader.type `loader_class` with data_loader.args, built
    without reading any data (predict.py and export.py have only the checkpoint): the class's
    `preset`, or args.preset (ImageFolderDataLoader)."""
    preset = loader_args.get("preset", getattr(loader_class, "preset", None))
    if preset is None:
        raise ConfigValueError(
            f"{loader_class.__name__} says neither how its inputs are made nor how to read new "
            "ones, which predict.py and export.py rebuild from the checkpoint alone: for images, "
            "set its class attribute `preset` (data_loader/transforms.py); for other data, give "
            "it the classmethods read_inputs(path, args, feature_names) and example_inputs(args, "
            "model, batch_size), as TabularDataLoader does (docs/predict-export.md)"
        )
    return preset_transform(preset, False, loader_args)

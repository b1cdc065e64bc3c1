"""ImageDataLoader: what the image classification loaders share (a transform preset, its sizes
and augmentation, and the choice of input pipeline), and load_image, their image reader."""

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import ExifTags, Image, ImageOps
from torchvision import datasets
from torchvision.transforms import v2

from base import BaseDataLoader
from base.base_data_loader import DataError
from data_loader.device_pipeline import DeviceBatches, Normalise
from data_loader.image_cache import decode_split
from data_loader.transforms import (
    AUTO_AUGMENT,
    FLIPS,
    IMAGE_SIZES,
    PADDING_MODES,
    preset_transform,
)
from utils import ConfigValueError, describe_error
from utils.data.sampler import EpochSampler, alternating_flips

# data_loader.args.pipeline: per-sample transforms in DataLoader workers, or the split held on
# the training device and augmented there a batch at a time (data_loader/device_pipeline.py).
PIPELINES = ("dataloader", "device")


class VisibleImageFolder(datasets.ImageFolder):
    """ImageFolder without hidden entries: class folders and files whose names start with "."
    (.ipynb_checkpoints, macOS's ._<name> beside each copied file: not images) are not data."""

    def __init__(self, root: str | os.PathLike, **kwargs: Any) -> None:
        super().__init__(root, is_valid_file=visible_image, **kwargs)

    def find_classes(self, directory: str | os.PathLike) -> tuple[list[str], dict[str, int]]:
        classes = [name for name in super().find_classes(directory)[0] if name[0] != "."]
        if not classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
        return classes, {name: index for index, name in enumerate(classes)}


def visible_image(path: str) -> bool:
    """An image file by its extension, as ImageFolder's are, and not a hidden file."""
    name = os.path.basename(path)
    return name[0] != "." and name.lower().endswith(datasets.folder.IMG_EXTENSIONS)


def exif_orientation(image: Image.Image) -> int:
    """The image's EXIF Orientation (1 to 8; 1, also when it has none: upright as stored), as PIL's
    ImageOps.exif_transpose reads it."""
    return image.getexif().get(ExifTags.Base.Orientation, 1)


def load_image(path: str) -> Image.Image:
    """An image file as 8-bit RGB (ImageFolder's loader), upright as an image viewer shows it (its
    EXIF Orientation applied), a file PIL cannot read reported as a DataError naming it."""
    return read_image(path)[0]


def read_image(path: str) -> tuple[Image.Image, int]:
    """load_image's image, and the EXIF Orientation (1 to 8) it was turned by."""
    try:
        with open(path, "rb") as file:
            image = Image.open(file)
            # A phone stores a portrait photo sideways and tags how to turn it for display.
            orientation = exif_orientation(image)
            ImageOps.exif_transpose(image, in_place=True)
            return eight_bit(image).convert("RGB"), orientation
    # PIL reports a broken file as OSError (also UnidentifiedImageError, "image file is
    # truncated"), SyntaxError or ValueError, depending on the format and the damage.
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise DataError(
            f"{path}: unreadable image ({describe_error(error)}); replace or remove it"
        ) from None


def read_mask(path: str | os.PathLike, orientation: int, *, image_path: str) -> np.ndarray:
    """A mask file's pixels as stored (class indices, not converted), turned by its EXIF
    Orientation, which must be its image's (`orientation`): a tag on one of the two alone leaves
    unknown which way round the mask was drawn."""
    with Image.open(path) as mask:
        if exif_orientation(mask) != orientation:
            raise DataError(
                f"{image_path}: EXIF Orientation {orientation}, but {exif_orientation(mask)} in "
                f"its mask {path}; save both the same way round (ImageOps.exif_transpose turns "
                "one upright)"
            )
        ImageOps.exif_transpose(mask, in_place=True)
        return np.asarray(mask)


def eight_bit(image: Image.Image) -> Image.Image:
    """A 16-bit grey image (mode "I;16...", or "I", read as 16-bit) scaled to 8 bits: PIL's own
    conversion to RGB clips its values at 255, which makes it nearly all white. Floating-point
    pixels, and 32-bit integers past 16 bits, whose range is not known, are refused."""
    if image.mode == "F":
        raise ValueError("floating-point pixels of unknown range; save it with 8 or 16 bits")
    if not image.mode.startswith("I"):
        return image
    values = np.asarray(image.convert("I"))  # (H, W) int32
    # Clipped to 16 bits, a 32-bit image's brighter pixels would all read as white.
    if values.size and (values.min() < 0 or values.max() > 65535):
        raise ValueError(
            f"32-bit integer pixels from {values.min()} to {values.max()}, past 16 bits "
            "(0 to 65535); save it with 8 or 16 bits"
        )
    return Image.fromarray(((values + 128) // 257).astype(np.uint8))


def load_image_tensor(path: str) -> torch.Tensor:
    """load_image's image as a (C, H, W) uint8 tensor."""
    return v2.functional.pil_to_tensor(load_image(path))


class ImageDataLoader(BaseDataLoader):
    """What the image classification loaders share: a transform preset ("cifar" unless the
    loader says otherwise) and its sizes and augmentation, from data_loader.args:

    image_size (training; the preset's default), eval_image_size (evaluation crop; default
    image_size), eval_resize_size ("imagenet": resize before that crop; default crop x 256/224),
    auto_augment ("trivialaugment", "randaugment" or "autoaugment"; null: none),
    random_erasing (the probability of erasing a random rectangle of a training image) and
    pipeline: "dataloader" (the transform per sample, in num_workers worker processes) or
    "device" (preset "cifar": the split held as uint8 images on the training device, cropped,
    flipped and normalised there a batch at a time; no worker processes). flip: "random",
    "alternating" (each sample flipped in every other pass) or "none"; crop_padding (4) and
    padding_mode ("constant" zeros, or "reflect"): the "cifar" preset's random crop.
    """

    preset = "cifar"

    def __init__(
        self,
        *,
        image_size: int | None = None,
        eval_image_size: int | None = None,
        eval_resize_size: int | None = None,
        auto_augment: str | None = None,
        random_erasing: float = 0.0,
        flip: str = "random",
        crop_padding: int | None = None,
        padding_mode: str | None = None,
        pipeline: str = "dataloader",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # The imagenet preset's crop is RandomResizedCrop: no padding to set.
        for name, value in (("crop_padding", crop_padding), ("padding_mode", padding_mode)):
            if value is not None and self.preset != "cifar":
                raise ConfigValueError(f'{name}: only for preset "cifar", not "{self.preset}"')
        crop_padding = 4 if crop_padding is None else crop_padding
        padding_mode = "constant" if padding_mode is None else padding_mode
        if flip not in FLIPS:
            raise ConfigValueError(f"flip must be one of {', '.join(FLIPS)}, got {flip!r}")
        if padding_mode not in PADDING_MODES:
            raise ConfigValueError(
                f"padding_mode must be one of {', '.join(PADDING_MODES)}, got {padding_mode!r}"
            )
        if not (isinstance(crop_padding, int) and 0 <= crop_padding < 16):
            raise ConfigValueError(
                f"crop_padding must be an integer in [0, 15], got {crop_padding!r}"
            )
        for name, value in (
            ("image_size", image_size),
            ("eval_image_size", eval_image_size),
            ("eval_resize_size", eval_resize_size),
        ):
            if value is not None and not (isinstance(value, int) and value > 0):
                raise ConfigValueError(f"{name} must be a positive integer or null, got {value!r}")
        if auto_augment is not None and auto_augment not in AUTO_AUGMENT:
            raise ConfigValueError(
                f"auto_augment must be one of {', '.join(AUTO_AUGMENT)} or null, got {auto_augment!r}"
            )
        if not (isinstance(random_erasing, int | float) and 0 <= random_erasing <= 1):
            raise ConfigValueError(
                f"random_erasing must be a probability in [0, 1], got {random_erasing!r}"
            )
        self.image_size = image_size
        self.augmentation = {
            "eval_image_size": eval_image_size,
            "auto_augment": auto_augment,
            "random_erasing": random_erasing,
            "flip": flip,
        }
        if self.preset == "cifar":
            self.augmentation.update(crop_padding=crop_padding, padding_mode=padding_mode)
        if eval_resize_size is not None:
            if self.preset != "imagenet":
                raise ConfigValueError(
                    f'eval_resize_size: only for preset "imagenet", not "{self.preset}"'
                )
            # CenterCrop pads an image smaller than the crop: black borders on every one.
            crop = eval_image_size or image_size or IMAGE_SIZES[self.preset]
            if eval_resize_size < crop:
                raise ConfigValueError(
                    f"eval_resize_size: {eval_resize_size} is smaller than the evaluation crop "
                    f"{crop} (eval_image_size, else image_size)"
                )
            self.augmentation["eval_resize_size"] = eval_resize_size
        self.pipeline = pipeline
        self.check_pipeline()
        # (where the split comes from, size) -> (uint8 images, labels) on self.device.
        self._on_device: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def check_pipeline(self) -> None:
        """Refuse what the device pipeline does not do, saying what to use instead."""
        if self.pipeline not in PIPELINES:
            raise ConfigValueError(
                f"pipeline must be one of {', '.join(PIPELINES)}, got {self.pipeline!r}"
            )
        if self.pipeline != "device":
            return
        if self.preset != "cifar":
            raise ConfigValueError(
                f'pipeline "device": only for preset "cifar" (crop with padding + flip), not '
                f'"{self.preset}"; for larger images use "decode": "device" (ImageFolderDataLoader)'
            )
        for name in ("auto_augment", "random_erasing"):
            if self.augmentation[name]:
                raise ConfigValueError(
                    f'{name}: not with pipeline "device", which augments by crop and flip '
                    f'only; use pipeline "dataloader" for it'
                )

    def transform(self, augment: bool) -> Callable:
        return preset_transform(
            self.preset, augment, {"image_size": self.image_size, **self.augmentation}
        )

    def size(self, augment: bool) -> int:
        """The side of the (square, for "cifar") images the model sees in training or evaluation."""
        train_size = self.image_size or IMAGE_SIZES[self.preset]
        return train_size if augment else self.augmentation["eval_image_size"] or train_size

    def train_sampler(self) -> EpochSampler:
        sampler = super().train_sampler()
        if self.augmentation["flip"] == "alternating":
            sampler.flips = alternating_flips(len(self.dataset("train")), self.seed)
        return sampler

    def loader(
        self, split: str, sampler: EpochSampler, *, augment: bool, drop_last: bool = False
    ) -> Any:
        if self.pipeline != "device":
            return super().loader(split, sampler, augment=augment, drop_last=drop_last)
        images, labels = self.device_split(split, self.size(augment))
        return DeviceBatches(
            images,
            labels,
            sampler,
            dataset=self.view(split, augment),
            batch_size=self.batch_size,
            drop_last=drop_last,
            augment=augment,
            normalise=Normalise(self.mean, self.std, self.device),
            seed=self.seed,
            padding=self.augmentation.get("crop_padding", 4),
            padding_mode=self.augmentation.get("padding_mode", "constant"),
            flip=self.augmentation["flip"],
        )

    def device_split(self, split: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`split` at `size` as uint8 images (N, C, size, size) and labels (N,) on self.device,
        made once (splits from the same place, e.g. an ImageFolder's val/ as "val" and
        "test", share it)."""
        key = (self.location(split), size)
        if key not in self._on_device:
            images, labels = self.uint8_split(split, size)
            self._on_device[key] = images.to(self.device), labels.to(self.device)
        return self._on_device[key]

    def uint8_split(self, split: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`split` as (uint8 (N, C, size, size), int64 labels (N,)) on the CPU, each image as the
        cifar preset's first steps make it (v2.ToImage, v2.Resize((size, size))). Subclasses
        with the images in one array, or a cache, override it."""
        return decode_split(self.dataset(split), size, num_workers=self.num_workers)

"""ImageDataLoader: what the image classification loaders share (a transform preset, its sizes
and augmentation, and the choice of input pipeline). Their image files are read by
data_loader/image_files.py."""

from collections.abc import Callable
from typing import Any

import torch

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
            # 2, not 1: torch's antialiased uint8 resize of an array image to 1 x 1 fails an
            # internal assertion at the first batch, and one pixel leaves nothing to learn.
            if value is not None and not (isinstance(value, int) and value >= 2):
                raise ConfigValueError(f"{name} must be an integer >= 2 or null, got {value!r}")
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
            # Reflect padding mirrors pixels of the image itself: it needs that many beyond the
            # edge row (torch's pad refuses it at the first batch otherwise, in either pipeline).
            if padding_mode == "reflect" and crop_padding >= self.size(augment=True):
                raise ConfigValueError(
                    f'crop_padding: {crop_padding} with padding_mode "reflect" must be smaller '
                    f"than the training image size {self.size(augment=True)}"
                )
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
            try:
                self._on_device[key] = images.to(self.device), labels.to(self.device)
            except torch.OutOfMemoryError as error:
                # A split too large for the device is the config's choice, not a bug: one line.
                raise DataError(
                    f'pipeline "device": split "{split}" ({len(images)} images of {size} px, '
                    f"{images.nbytes / 2**30:.2f} GiB as uint8) does not fit in {self.device} "
                    f'memory ({describe_error(error)}); use "pipeline": "dataloader" or a '
                    "smaller image_size"
                ) from None
        return self._on_device[key]

    def uint8_split(self, split: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`split` as (uint8 (N, C, size, size), int64 labels (N,)) on the CPU, each image as the
        cifar preset's first steps make it (v2.ToImage, v2.Resize((size, size))). Subclasses
        with the images in one array, or a cache, override it."""
        return decode_split(self.dataset(split), size, num_workers=self.num_workers)

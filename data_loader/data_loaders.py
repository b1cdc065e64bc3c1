"""The data loaders a config can name in data_loader.type."""

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from torchvision import datasets
from torchvision.transforms import v2

# BaseDataLoader: what a loader you add here subclasses (docs/extending.md#data).
from base.base_data_loader import BaseDataLoader, DataError  # noqa: F401
from data_loader.device_decode import DeviceDecodedBatches, EncodedImages, collate_encoded
from data_loader.device_pipeline import Normalise, stack_arrays
from data_loader.image_cache import cache_path, decode_and_cache, load_cached
from data_loader.image_files import VisibleImageFolder, load_image, load_image_tensor
from data_loader.image_loader import ImageDataLoader
from data_loader.noisy_shapes import NoisyShapesDataLoader
from data_loader.synthetic import SyntheticShapes
from data_loader.tabular import TabularDataLoader
from data_loader.tasks.detection import DetectionDataLoader
from data_loader.tasks.segmentation import SegmentationDataLoader
from data_loader.tasks.sequences import SequenceDataLoader
from data_loader.transforms import IMAGE_SIZES, PRESETS, STATS, augmentation_policy
from utils import ConfigValueError, describe_error
from utils.data.sampler import EpochSampler

# data_loader.args.decode (ImageFolderDataLoader): PIL in the worker processes, or JPEGs
# decoded on the training device (data_loader/device_decode.py).
DECODERS = ("pil", "device")

__all__ = [
    "Cifar10DataLoader",
    "DetectionDataLoader",
    "ImageFolderDataLoader",
    "NoisyShapesDataLoader",
    "SegmentationDataLoader",
    "SequenceDataLoader",
    "SyntheticDataLoader",
    "TabularDataLoader",
]


class Cifar10DataLoader(ImageDataLoader):
    """torchvision's CIFAR-10: 50,000 training images ("train") and the 10,000 test images ("test")."""

    splits = ("train", "test")

    def __init__(self, data_dir: str, *, download: bool = True, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.data_dir = Path(data_dir)
        self.download = download
        self.mean, self.std = STATS["cifar"]

    def prepare_data(self) -> None:
        """Download and extract the archive when it is missing (and download is true)."""
        if self.download:
            # Kept: the training split is then not read a second time.
            self._loaded["train"] = self._cifar10("train", download=True)

    def load_split(self, split: str) -> Dataset:
        return self._cifar10(split, download=False)

    def _cifar10(self, split: str, *, download: bool) -> Dataset:
        try:
            return datasets.CIFAR10(self.data_dir, train=split == "train", download=download)
        except Exception as error:  # no network, a corrupt archive, a read-only folder...
            tried = " and could not be downloaded" if download else ""
            raise DataError(
                f"CIFAR-10 not found in {self.data_dir / 'cifar-10-batches-py'}{tried} "
                f"({describe_error(error)}). Fix: download cifar-10-python.tar.gz from "
                "https://www.cs.toronto.edu/~kriz/cifar.html and extract it into "
                f"{self.data_dir}, or point data_loader.args.data_dir at a copy. "
                "Offline: python train.py -c configs/demo.json"
            ) from None

    def class_names(self) -> list[str]:
        return list(self.dataset("train").classes)

    def location(self, split: str) -> str:
        return f"{self.data_dir / 'cifar-10-batches-py'} ({split})"

    def uint8_split(self, split: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        dataset = self.dataset(split)  # torchvision's CIFAR10 holds .data (N, 32, 32, 3) uint8
        return stack_arrays(dataset.data, dataset.targets, size)


class ImageFolderDataLoader(ImageDataLoader):
    """ImageNet-style folders: data_dir/train/<class>/*, data_dir/val/<class>/*, optional test/.

    preset "imagenet" (RandomResizedCrop + flip; Resize + CenterCrop for evaluation, at
    image_size, default 224) or "cifar" (crop with padding + flip, 32x32 unless image_size
    says); the augmentation arguments and `pipeline` are ImageDataLoader's.
    The "test" split is test/ when present, else val/.

    decode "device": worker processes read the files' bytes, JPEGs are decoded on the training
    device and the preset's transforms run there. pipeline "device": each split folder is
    decoded once into cache_dir (default data_dir/.cache), reused until its files change.
    """

    preset = "imagenet"  # the default; data_loader.args.preset sets this loader's own

    def __init__(
        self,
        data_dir: str,
        *,
        preset: str = "imagenet",
        decode: str = "pil",
        cache_dir: str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> None:
        if preset not in PRESETS:
            raise ConfigValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
        self.preset = preset  # before ImageDataLoader checks the sizes against it
        super().__init__(**kwargs)
        if decode not in DECODERS:
            raise ConfigValueError(f"decode must be one of {', '.join(DECODERS)}, got {decode!r}")
        if decode == "device" and self.pipeline == "device":
            raise ConfigValueError(
                'decode "device" streams files; pipeline "device" holds them decoded already: '
                "choose one"
            )
        if cache_dir is not None and not isinstance(cache_dir, str | os.PathLike):
            raise ConfigValueError(f"cache_dir must be a folder path or null, got {cache_dir!r}")
        self.decode = decode
        self.data_dir = Path(data_dir)
        self.cache_dir = self.data_dir / ".cache" if cache_dir is None else Path(cache_dir)
        # Splits decoded by prepare_data where no cache could be written: not decoded twice.
        self._decoded: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.mean, self.std = STATS[preset]
        if not (self.data_dir / "train").is_dir():
            raise DataError(
                f"{self.data_dir / 'train'}: folder not found; expected "
                f"{self.data_dir}/train/<class>/<image> (and val/<class>/<image>)"
            )
        present = [split for split in ("train", "val", "test") if (self.data_dir / split).is_dir()]
        # test.py's default split: test/ when it exists, else val/.
        self.splits = (
            (*present, "test") if "test" not in present and "val" in present else tuple(present)
        )

    def location(self, split: str) -> str:
        folder = self.data_dir / split
        # test.py's "test" split falls back to val/.
        return str(folder if folder.is_dir() else self.data_dir / "val")

    def load_split(self, split: str) -> Dataset:
        folder = Path(self.location(split))
        try:
            # An evaluation set may hold no image of a class: its folder is then empty.
            dataset = VisibleImageFolder(folder, loader=load_image, allow_empty=split != "train")
        except (FileNotFoundError, OSError) as error:
            raise DataError(f"{folder}: {error}") from None
        if split != "train" and dataset.classes != self.dataset("train").classes:
            raise DataError(
                f"{folder}: its class folders {dataset.classes} differ from those of "
                f"{self.data_dir / 'train'}, which give the labels; make them the same (an "
                "empty folder for a class without images)"
            )
        return dataset

    def class_names(self) -> list[str]:
        return list(self.dataset("train").classes)

    def prepare_data(self) -> None:
        """pipeline "device": decode what training reads into cache_dir, if it is not there yet
        (train.py calls this on one process per node before the others read the cache)."""
        if self.pipeline != "device":
            return
        needed = [("train", self.size(augment=True))]
        source = self.validation_source()
        if source is not None:
            needed.append((source[0], self.size(augment=False)))
        for split, size in needed:
            key, dataset = (self.location(split), size), self.dataset(split)
            path = cache_path(dataset, size, self.cache_dir)
            if key not in self._decoded and not path.is_file():
                decoded = decode_and_cache(dataset, size, path, num_workers=self.num_workers)
                self._decoded[key] = decoded

    def uint8_split(self, split: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The split folder decoded at `size`: from cache_dir when its files are unchanged."""
        key = (self.location(split), size)
        if key in self._decoded:
            return self._decoded.pop(key)
        dataset = self.dataset(split)
        path = cache_path(dataset, size, self.cache_dir)
        cached = load_cached(path)
        if cached is not None:
            return cached
        return decode_and_cache(dataset, size, path, num_workers=self.num_workers)

    def loader(
        self, split: str, sampler: EpochSampler, *, augment: bool, drop_last: bool = False
    ) -> Any:
        if self.decode != "device":
            return super().loader(split, sampler, augment=augment, drop_last=drop_last)
        files = self.data_loader(
            EncodedImages(self.dataset(split).samples, load_image_tensor),
            sampler,
            drop_last=drop_last,
            collate_fn=collate_encoded,
        )
        return DeviceDecodedBatches(
            files,
            dataset=self.view(split, augment),
            transform=self.device_transform(augment),
            normalise=Normalise(self.mean, self.std, self.device),
            random_erasing=self.augmentation["random_erasing"] if augment else 0.0,
            pil_decode=load_image_tensor,
        )

    def device_transform(self, augment: bool) -> Callable:
        """The preset's per-image steps on uint8 images (crops, flips, auto_augment): its
        transform without the conversion and normalisation, which run on the whole batch, and
        without random erasing, which runs after them (device_decode.erase_randomly)."""
        size = self.image_size or IMAGE_SIZES[self.preset]
        options = {**self.augmentation, "random_erasing": 0.0, "auto_augment": None}
        steps = PRESETS[self.preset](augment, image_size=size, **options).transforms
        assert isinstance(steps[-2], v2.ToDtype) and isinstance(steps[-1], v2.Normalize)
        # The policy where the preset puts it, after crop and flip, in its variant for the
        # device: torchvision's copies a matrix to the device per image it shears, translates
        # or rotates.
        name = self.augmentation["auto_augment"] if augment else None
        return v2.Compose(steps[:-2] + augmentation_policy(name, self.preset, on_device=True))


class SyntheticDataLoader(ImageDataLoader):
    """Offline CIFAR-shaped data (3x32x32, 10 classes): see data_loader/synthetic.py.

    The training and test splits are drawn from different seeds derived from data_seed,
    which is separate from the run's seed so that changing the seed keeps the data.
    """

    splits = ("train", "test")

    def __init__(
        self, *, num_train: int = 5000, num_test: int = 1000, data_seed: int = 0, **kwargs: object
    ) -> None:
        super().__init__(**kwargs)
        # data_seed too: numpy's seed takes no float, nor one below 0 (a traceback at load)
        for name, value, least in (
            ("num_train", num_train, 1), ("num_test", num_test, 1), ("data_seed", data_seed, 0)
        ):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigValueError(f"{name} must be an integer >= {least}, got {value!r}")
        self.sizes = {"train": num_train, "test": num_test}
        self.data_seed = data_seed
        self.mean, self.std = STATS["cifar"]

    def load_split(self, split: str) -> Dataset:
        return SyntheticShapes(self.sizes[split], seed=[self.data_seed, self.splits.index(split)])

    def class_names(self) -> list[str]:
        return list(SyntheticShapes.classes)

    def uint8_split(self, split: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        dataset = self.dataset(split)
        return stack_arrays(dataset.images, dataset.labels, size)

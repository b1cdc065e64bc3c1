"""The data loaders a config can name in data_loader.type."""

from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets
from torchvision.transforms import v2

from base import BaseDataLoader
from base.base_data_loader import DataError
from data_loader.synthetic import SyntheticShapes
from data_loader.transforms import AUTO_AUGMENT, IMAGE_SIZES, PRESETS, STATS
from utils import ConfigValueError, derive_seed, describe_error

__all__ = [
    "Cifar10DataLoader",
    "ImageFolderDataLoader",
    "NoisyShapesDataLoader",
    "SyntheticDataLoader",
]


def load_image(path: str) -> Image.Image:
    """ImageFolder's loader, with a file PIL cannot read reported as a DataError naming it."""
    try:
        return datasets.folder.default_loader(path)
    # PIL reports a broken file as OSError (also UnidentifiedImageError, "image file is
    # truncated"), SyntaxError or ValueError, depending on the format and the damage.
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise DataError(
            f"{path}: unreadable image ({describe_error(error)}); replace or remove it"
        ) from None


class ImageDataLoader(BaseDataLoader):
    """What the image classification loaders share: a transform preset ("cifar" unless the
    loader says otherwise) and its sizes and augmentation, from data_loader.args:

    image_size (training; the preset's default), eval_image_size (evaluation crop; default
    image_size), eval_resize_size ("imagenet": resize before that crop; default crop x 256/224),
    auto_augment ("trivialaugment", "randaugment" or "autoaugment"; null: none) and
    random_erasing (the probability of erasing a random rectangle of a training image).
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
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)
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
        }
        if eval_resize_size is not None:
            if self.preset != "imagenet":
                raise ConfigValueError(
                    f'eval_resize_size: only for preset "imagenet", not "{self.preset}"'
                )
            self.augmentation["eval_resize_size"] = eval_resize_size

    def transform(self, augment: bool) -> Callable:
        size = self.image_size or IMAGE_SIZES[self.preset]
        return PRESETS[self.preset](augment, image_size=size, **self.augmentation)


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


class ImageFolderDataLoader(ImageDataLoader):
    """ImageNet-style folders: data_dir/train/<class>/*, data_dir/val/<class>/*, optional test/.

    preset "imagenet" (RandomResizedCrop + flip; Resize + CenterCrop for evaluation, at
    image_size, default 224) or "cifar" (crop with padding + flip, 32x32 unless image_size
    says); the augmentation arguments are ImageDataLoader's.
    The "test" split is test/ when present, else val/.
    """

    preset = "imagenet"  # the default; data_loader.args.preset sets this loader's own

    def __init__(self, data_dir: str, *, preset: str = "imagenet", **kwargs: object) -> None:
        if preset not in PRESETS:
            raise ConfigValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
        self.preset = preset  # before ImageDataLoader checks the sizes against it
        super().__init__(**kwargs)
        self.data_dir = Path(data_dir)
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
            dataset = datasets.ImageFolder(folder, loader=load_image)
        except (FileNotFoundError, OSError) as error:
            raise DataError(f"{folder}: {error}") from None
        if split != "train" and dataset.classes != self.dataset("train").classes:
            raise DataError(
                f"{folder}: its class folders {dataset.classes} differ from those of "
                f"{self.data_dir / 'train'}"
            )
        return dataset

    def class_names(self) -> list[str]:
        return list(self.dataset("train").classes)


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
        for name, value in (("num_train", num_train), ("num_test", num_test)):
            if not isinstance(value, int) or value < 1:
                raise ConfigValueError(f"{name} must be a positive integer, got {value!r}")
        self.sizes = {"train": num_train, "test": num_test}
        self.data_seed = data_seed
        self.mean, self.std = STATS["cifar"]

    def load_split(self, split: str) -> Dataset:
        return SyntheticShapes(self.sizes[split], seed=[self.data_seed, self.splits.index(split)])

    def class_names(self) -> list[str]:
        return list(SyntheticShapes.classes)


class NoisyShapesDataLoader(BaseDataLoader):
    """(noisy image, clean image) pairs of the synthetic shapes, for denoising
    (configs/denoise.json): not classification, so no classes and no label checks.

    The clean images are in [0, 1]; the noise is Gaussian with standard deviation noise_std. It is
    drawn anew at every training epoch (from the epoch's seeded RNG) and fixed per image for
    validation and test, so that their PSNR compares across epochs and runs.
    """

    splits = ("train", "test")

    def __init__(
        self,
        *,
        num_train: int = 5000,
        num_test: int = 1000,
        data_seed: int = 0,
        noise_std: float = 0.2,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)
        if not noise_std > 0:
            raise ConfigValueError(f"noise_std must be > 0, got {noise_std!r}")
        self.sizes = {"train": num_train, "test": num_test}
        self.data_seed = data_seed
        self.noise_std = noise_std

    def load_split(self, split: str) -> Dataset:
        return SyntheticShapes(self.sizes[split], seed=[self.data_seed, self.splits.index(split)])

    def transform(self, augment: bool) -> Callable:
        return v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])  # (3, 32, 32)

    def view(self, split: str, augment: bool) -> Dataset:
        fixed_seed = None if augment else derive_seed(self.data_seed, self.splits.index(split))
        return NoisyImages(self.dataset(split), self.transform(augment), self.noise_std, fixed_seed)

    def class_names(self) -> list[str]:
        return []


class NoisyImages(Dataset):
    """(clean image + noise, clean image); the noise fixed per index when fixed_seed is given."""

    def __init__(
        self, images: Dataset, transform: Callable, noise_std: float, fixed_seed: int | None
    ) -> None:
        self.images, self.transform = images, transform
        self.noise_std, self.fixed_seed = noise_std, fixed_seed

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        clean = self.transform(self.images[index][0])  # (C, H, W) in [0, 1]
        generator = None
        if self.fixed_seed is not None:
            generator = torch.Generator().manual_seed(derive_seed(self.fixed_seed, index))
        noise = torch.randn(clean.shape, generator=generator) * self.noise_std
        return clean + noise, clean

"""Denoising data: (noisy image, clean image) pairs of the synthetic shapes (configs/denoise.json).

Named in configs as data_loader.type "NoisyShapesDataLoader" (exported by data_loaders.py).
"""

from collections.abc import Callable

import torch
from torch.utils.data import Dataset
from torchvision.transforms import v2

from base import BaseDataLoader
from data_loader.synthetic import SyntheticShapes
from utils import ConfigValueError, derive_seed
from utils.util import is_number


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
        # data_seed too: numpy's seed takes no float, nor one below 0 (a traceback at load)
        for name, value, least in (
            ("num_train", num_train, 1), ("num_test", num_test, 1), ("data_seed", data_seed, 0)
        ):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if not (is_number(noise_std) and noise_std > 0):
            raise ConfigValueError(f"noise_std must be a number > 0, got {noise_std!r}")
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

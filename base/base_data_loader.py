"""Base class for data: train / validation / test DataLoaders from one set of splits.

A subclass says how to load each split (untransformed (image, label) pairs) and which
transform to apply; this class does the seeded validation split, the samplers and the loaders.
"""

import abc
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from utils import UserError, derive_seed


class DataError(UserError):
    """Data that is missing, empty or unusable."""


class EpochSampler(Sampler[int]):
    """Yields `indices` in an order that depends only on (seed, epoch, pass), never on global RNG.

    With num_replicas > 1 each rank takes every num_replicas-th position of the same order,
    so the shares are disjoint. `pad` repeats the first indices until every rank has the same
    count (training needs equal step counts under DDP); evaluation leaves it off so every
    sample is counted exactly once.
    """

    def __init__(
        self,
        indices: Sequence[int],
        *,
        shuffle: bool,
        seed: int,
        num_replicas: int = 1,
        rank: int = 0,
        pad: bool = False,
    ) -> None:
        self.indices = np.asarray(indices, dtype=np.int64)
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.pad = pad
        self.epoch = 0
        self.pass_index = 0
        self.start = 0
        # Handed to the DataLoader, which draws its worker base seed from it rather than from
        # the global RNG: worker seeds follow (seed, epoch, pass), and a mid-epoch resume that
        # restores the global RNG state is not thrown off by a new iterator's seed draw.
        self.generator = torch.Generator()

    def set_epoch(self, epoch: int, pass_index: int = 0, start: int = 0) -> None:
        """Choose the order for this epoch (and pass, when an epoch spans several passes).

        `start` skips that many of this rank's indices: a mid-epoch resume continues there.
        """
        self.epoch = epoch
        self.pass_index = pass_index
        self.start = start
        self.generator.manual_seed(derive_seed(self.seed, epoch, pass_index, self.rank))

    def __iter__(self) -> Any:
        order = self.indices
        if self.shuffle:
            generator = np.random.default_rng([self.seed, self.epoch, self.pass_index])
            order = order[generator.permutation(len(order))]
        if self.pad and len(order) % self.num_replicas:
            extra = self.num_replicas - len(order) % self.num_replicas
            order = np.concatenate([order, np.resize(order, extra)])
        return iter(order[self.rank :: self.num_replicas][self.start :].tolist())

    def __len__(self) -> int:
        if self.pad:
            return -(-len(self.indices) // self.num_replicas)
        return len(range(self.rank, len(self.indices), self.num_replicas))


class TransformedDataset(Dataset):
    """A view of `dataset` with `transform` applied to each image; shares the underlying data."""

    def __init__(self, dataset: Dataset, transform: Callable) -> None:
        self.dataset = dataset
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, label = self.dataset[index]
        return self.transform(image), label


class BaseDataLoader(abc.ABC):
    """Builds the train, validation and test DataLoaders.

    validation_split takes a seeded share of the training split (a fraction or a count);
    that share is seen without augmentation. With validation_split 0, a "val" split of the
    data itself (if the subclass has one) is used instead.
    """

    splits: tuple[str, ...] = ("train", "test")
    # The normalisation the transform applies; the TensorBoard image grid undoes it.
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)

    def __init__(
        self,
        *,
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        validation_split: float | int = 0.0,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        rank: int = 0,
        num_replicas: int = 1,
    ) -> None:
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.validation_split = validation_split
        self.num_workers = num_workers
        self.pin_memory = pin_memory and torch.cuda.is_available()
        # Both only mean something with worker processes; DataLoader rejects them otherwise.
        self.persistent_workers = persistent_workers and num_workers > 0
        self.prefetch_factor = prefetch_factor if num_workers > 0 else None
        self.rank = rank
        self.num_replicas = num_replicas
        self._loaded: dict[str, Dataset] = {}

    @abc.abstractmethod
    def load_split(self, split: str) -> Dataset:
        """The untransformed (image, label) pairs of `split` (one of self.splits)."""

    @abc.abstractmethod
    def transform(self, augment: bool) -> Callable:
        """Image -> normalised CHW float tensor; with augmentation for training."""

    @abc.abstractmethod
    def class_names(self) -> list[str]:
        """Names of the classes, in label order."""

    def dataset(self, split: str) -> Dataset:
        """`split` loaded once and shared by every view of it."""
        if split not in self._loaded:
            self._loaded[split] = self.load_split(split)
        return self._loaded[split]

    def split_indices(self) -> tuple[np.ndarray, np.ndarray]:
        """(train, validation) indices into the training split, from a permutation seeded by seed."""
        num_samples = len(self.dataset("train"))
        if isinstance(self.validation_split, float):
            num_val = round(num_samples * self.validation_split)
        else:
            num_val = self.validation_split
        if num_val >= num_samples:
            raise DataError(
                f"data_loader.args.validation_split: {self.validation_split} leaves no training "
                f"samples out of {num_samples}"
            )
        # A dedicated generator: the split is the same on every rank and in test.py.
        order = np.random.default_rng([self.seed, 0x5EED]).permutation(num_samples)
        return np.sort(order[num_val:]), np.sort(order[:num_val])

    def _loader(
        self, dataset: Dataset, sampler: EpochSampler, *, drop_last: bool = False
    ) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            generator=sampler.generator,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers,
            prefetch_factor=self.prefetch_factor,
            drop_last=drop_last,
        )

    def train_loader(self) -> DataLoader:
        indices, _ = self.split_indices()
        sampler = EpochSampler(
            indices,
            shuffle=self.shuffle,
            seed=self.seed,
            num_replicas=self.num_replicas,
            rank=self.rank,
            pad=self.num_replicas > 1,
        )
        return self._loader(
            TransformedDataset(self.dataset("train"), self.transform(True)), sampler
        )

    def val_loader(self) -> DataLoader | None:
        """The validation loader, or None when there is no validation data."""
        if self.validation_split:
            _, indices = self.split_indices()
            return self._eval_loader("train", indices)
        if "val" in self.splits:
            return self.eval_loader("val")
        return None

    def eval_loader(self, split: str) -> DataLoader:
        """Every sample of `split` exactly once, without augmentation ("val" means the validation set)."""
        if split == "val" and self.validation_split:
            loader = self.val_loader()
            assert loader is not None
            return loader
        if split not in self.splits:
            raise DataError(f"this data has no {split!r} split (it has: {', '.join(self.splits)})")
        return self._eval_loader(split, np.arange(len(self.dataset(split))))

    def _eval_loader(self, split: str, indices: np.ndarray) -> DataLoader:
        sampler = EpochSampler(
            indices, shuffle=False, seed=self.seed, num_replicas=self.num_replicas, rank=self.rank
        )
        return self._loader(TransformedDataset(self.dataset(split), self.transform(False)), sampler)

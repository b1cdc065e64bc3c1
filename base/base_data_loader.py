"""Base class for data: train / validation / test DataLoaders from one set of splits.

A subclass says how to load each split (untransformed (image, label) pairs) and which
transform to apply; this class does the validation split or cross-validation fold, the
samplers, the loaders, and the checks and summary of the data before training."""

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from utils.config.config_checks import SAMPLERS
from utils.data import splits as data_splits
from utils.data import targets as data_targets
from utils.data.batches import Loader
from utils.data.sampler import EpochSampler, TransformedDataset
from utils.util import ConfigValueError, DataError


class BaseDataLoader(abc.ABC):
    """Builds the train, validation and test DataLoaders.

    The validation data (never augmented) is, first that applies: fold `fold` of `folds` (k-fold,
    stratified, seeded); a seeded validation_split share of the training split (a fraction or a
    count); the data's own "val" split. `sampler` draws the training data (EpochSampler,
    SAMPLERS); shuffle=False is the older spelling of sampler "sequential"."""

    splits: tuple[str, ...] = ("train", "test")
    # The normalisation the transform applies; the TensorBoard image grid undoes it.
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    preset: str | None = None  # transform()'s transforms.py preset: predict.py rebuilds it
    ignore_index: int | None = None  # a target value that is no class, e.g. 255: unlabelled
    # export.py: input/output names, and input dims besides the batch that vary ({1: "length"})
    input_names: tuple[str, ...] = ("images",)
    output_names: tuple[str, ...] = ("logits",)
    dynamic_dims: ClassVar[dict[int, str]] = {}

    def __init__(
        self,
        *,
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        sampler: str = "random",
        replacement: bool = False,
        num_samples: int | None = None,
        class_weights: list[float] | None = None,
        validation_split: float | int = 0.0,
        folds: int | None = None,
        fold: int | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = True,
        prefetch_factor: int | None = None,
        rank: int = 0,
        num_replicas: int = 1,
        device: torch.device | str = "cpu",
    ) -> None:
        if sampler not in SAMPLERS:
            raise ConfigValueError(
                f"unknown sampler {sampler!r}; choose from {', '.join(SAMPLERS)}"
            )
        self.batch_size, self.seed = batch_size, seed
        self.sampler = sampler if shuffle else "sequential"
        self.replacement, self.num_samples = replacement, num_samples
        self.class_weights, self.validation_split = class_weights, validation_split
        self.folds, self.fold = folds, fold
        self.num_workers = num_workers
        self.pin_memory = pin_memory and torch.cuda.is_available()  # build_trainer: by device
        # Both only mean something with worker processes; DataLoader rejects them otherwise.
        self.persistent_workers = persistent_workers and num_workers > 0
        self.prefetch_factor = prefetch_factor if num_workers > 0 else None
        self.rank, self.num_replicas = rank, num_replicas
        self.device = torch.device(device)  # the training device: device-side pipelines use it
        self._loaded: dict[str, Dataset] = {}
        self._target_classes: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # utils/data/targets

    def prepare_data(self) -> None:  # noqa: B027 (an optional hook, not abstract)
        """Fetch what is missing (e.g. download it). train.py calls it on one process per node
        while the others wait, before any split is loaded; test.py calls it too."""

    @abc.abstractmethod
    def load_split(self, split: str) -> Dataset:
        """The untransformed (image, label) pairs of `split` (one of self.splits)."""

    @abc.abstractmethod
    def transform(self, augment: bool) -> Callable:
        """Image -> normalised CHW float tensor; with augmentation for training."""

    def pair_transform(self, augment: bool) -> Callable[[Any, Any], tuple[Any, Any]] | None:
        """(input, target) -> both transformed together (e.g. one flip of an image and its mask),
        drawing from the generator TransformedDataset seeds per sample: a function of (seed,
        epoch, index), resume-exact. Default None: transform(augment) of the input alone."""
        return None

    def target_classes(self, target: Any) -> np.ndarray:
        """The class indices one target holds, 1-D int64: [label] for a label, every element of
        an integer tensor or image (a mask), ignore_index left out. Override it for other targets
        (e.g. `return np.asarray(target["labels"])` for dicts of boxes)."""
        values = np.asarray(target).reshape(-1)
        if values.dtype.kind not in "iu":
            raise TypeError(f"{values.dtype} values")
        keep = values != self.ignore_index if self.ignore_index is not None else slice(None)
        return values[keep].astype(np.int64, copy=False)

    @abc.abstractmethod
    def class_names(self) -> list[str]:
        """Names of the classes, in label order."""

    def feature_names(self) -> list[str]:
        """Names of the inputs' columns, in the model's order (a table's features); [] here."""
        return []

    def location(self, split: str) -> str:
        """Where `split` comes from, for messages (subclasses with files name their folder)."""
        return f"the {split!r} split of {type(self).__name__}"

    def dataset(self, split: str) -> Dataset:
        """`split` loaded once and shared by every view of it."""
        if split not in self._loaded:
            self._loaded[split] = self.load_split(split)
        return self._loaded[split]

    def labels(self, split: str) -> np.ndarray:
        """(N,) the one class label of each sample of `split` (target_classes of its target), for
        the weighted sampler and the folds; other targets (masks, boxes) are refused in one line."""
        return data_targets.sample_labels(self, split)

    def training_samples(self, limit: int | None = None, *, transformed: bool = False) -> list:
        """The training share's pairs (what a model's fit_data fits on): a seeded random `limit`
        of them; transformed: as view(split, augment=False) gives them, else untransformed."""
        indices, rng = self.split_indices()[0], np.random.default_rng([self.seed, 0xF17])
        if limit is not None and limit < len(indices):
            indices = rng.choice(indices, limit, replace=False)
        train = self.view("train", False) if transformed else self.dataset("train")
        return [train[int(index)] for index in indices]

    def split_indices(self) -> tuple[np.ndarray, np.ndarray]:
        """(train, validation) indices into the training split: fold `fold` when cross-validating,
        else the validation_split share (empty without one), from a permutation seeded by seed."""
        if self.folds:
            return self.fold_indices()
        num_samples = len(self.dataset("train"))
        num_val = data_splits.validation_count(num_samples, self.validation_split)
        return data_splits.holdout_split(num_samples, num_val, self.seed)

    def fold_indices(self) -> tuple[np.ndarray, np.ndarray]:
        """(train, validation) indices of fold `fold` of `folds`: the training split dealt out class
        by class, seeded, to the folds in turn (stratified: sizes and class shares within one)."""
        if self.fold is None:
            raise DataError(
                f"data_loader.args.fold: not set; choose which of the {self.folds} folds "
                "validates, e.g. --set data_loader.args.fold=0"
            )
        # Data without classes (regression) or one per sample (masks): dealt in seeded order alone.
        stratified = self.class_names() and data_targets.has_sample_labels(self, "train")
        labels = self.labels("train") if stratified else np.zeros(len(self.dataset("train")), int)
        if len(labels) < self.folds:
            raise DataError(
                f"data_loader.args.folds: {self.folds} folds need at least {self.folds} training "
                f"samples; {self.location('train')} has {len(labels)}"
            )
        return data_splits.stratified_fold(labels, self.folds, self.fold, self.seed)

    def validation_source(self) -> tuple[str, np.ndarray] | None:
        """(split, indices into it) of the validation data, or None when there is none."""
        if self.folds or self.validation_split:
            return "train", self.split_indices()[1]
        if "val" in self.splits:
            return "val", np.arange(len(self.dataset("val")))
        return None

    def sample_ids(self, split: str) -> list[str] | None:
        """What tells the samples of `split` apart, for fingerprint(): an image folder's file names
        (with labels), else the dataset's `targets`, else None (its size and indices alone)."""
        return data_splits.sample_ids(self.dataset(split))

    def fingerprint(self) -> dict:
        """Per split, its size and a digest of its indices and sample_ids: a resume, or test.py
        --split val, on other data than the checkpoint's is refused (utils/state/resume.py)."""
        sources = {"train": ("train", self.split_indices()[0]), "val": self.validation_source()}
        splits = {source[0] for source in sources.values() if source}  # "train" may hold both
        ids = {split: self.sample_ids(split) for split in splits}  # each split's samples read once
        digests = dict.fromkeys(sources)
        for name, source in sources.items():
            if source is not None:
                split, indices = source
                size = len(self.dataset(split))
                digests[name] = data_splits.split_digest(split, size, indices, ids[split])
        return digests

    def sampling_weights(self, indices: np.ndarray) -> np.ndarray:
        """Weight of one sample of each class for the weighted sampler (utils/data/splits.py)."""
        labels = self.labels("train")[indices]
        return data_splits.class_weights(
            labels, len(self.class_names()), self.class_weights, self.location("train")
        )

    def train_sampler(self) -> EpochSampler:
        """The training sampler of this rank: `sampler` over the training indices."""
        indices, _ = self.split_indices()
        weights = None
        if self.sampler == "weighted":
            weights = self.sampling_weights(indices)[self.labels("train")[indices]]
        drawn = self.sampler in ("random", "weighted")  # the samplers that take num_samples
        return EpochSampler(
            indices,
            shuffle=self.sampler != "sequential",
            seed=self.seed,
            num_replicas=self.num_replicas,
            rank=self.rank,
            pad=self.num_replicas > 1,
            replacement=self.replacement and self.sampler == "random",
            num_samples=self.num_samples if drawn else None,
            weights=weights,
            seeded=True,  # a sequential order is augmented too
        )

    def view(self, split: str, augment: bool) -> Dataset:
        """What the loaders of `split` read: (transformed input, target) pairs. Override it for
        other pairs, e.g. (noisy image, clean image) for denoising."""
        pair = self.pair_transform(augment)
        return TransformedDataset(self.dataset(split), self.transform(augment), pair)

    def train_loader(self, *, drop_last: bool = False) -> Loader:
        """The training loader of this rank. drop_last: leave out the short last batch of each
        pass (every batch then has batch_size samples), unless that leaves no batch at all."""
        sampler = self.train_sampler()
        drop_last = drop_last and len(sampler) >= self.batch_size
        return self.loader("train", sampler, augment=True, drop_last=drop_last)

    def val_loader(self) -> Loader | None:
        """The validation loader, or None when there is no validation data."""
        source = self.validation_source()
        return None if source is None else self._eval_loader(*source)

    def eval_loader(self, split: str) -> Loader:
        """Every sample of `split` exactly once, without augmentation ("val" means the validation set)."""
        source = self.validation_source() if split == "val" else None
        if source is not None:
            return self._eval_loader(*source)
        if split not in self.splits:
            raise DataError(f"this data has no {split!r} split (it has: {', '.join(self.splits)})")
        return self._eval_loader(split, np.arange(len(self.dataset(split))))

    def _eval_loader(self, split: str, indices: np.ndarray) -> Loader:
        sampler = EpochSampler(
            indices, shuffle=False, seed=self.seed, num_replicas=self.num_replicas, rank=self.rank
        )
        return self.loader(split, sampler, augment=False)

    def loader(
        self, split: str, sampler: EpochSampler, *, augment: bool, drop_last: bool = False
    ) -> Loader:
        """The batches of `split` in `sampler`'s order (train_loader, the evaluation loaders). Other
        pipelines override it with any utils.data.batches.Loader (ImageDataLoader's "device")."""
        dataset, collate_fn = self.view(split, augment), self.collate(split)
        return self.data_loader(dataset, sampler, drop_last=drop_last, collate_fn=collate_fn)

    def collate(self, split: str) -> Callable | None:
        """The function that makes one batch of `split` from a list of view() samples, e.g. pads
        sequences of unequal length (docs/data.md#batches). None: torch's default_collate."""
        return None

    def data_loader(
        self,
        dataset: Dataset,
        sampler: EpochSampler,
        *,
        drop_last: bool = False,
        collate_fn: Callable | None = None,
    ) -> DataLoader:
        """A DataLoader over `dataset` with this loader's batch size and worker settings."""
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
            collate_fn=collate_fn,
        )

    def check(self, num_classes: int | None) -> None:
        """Refuse training targets with classes outside the model's `num_classes` outputs (None:
        unknown), read through target_classes (labels, or every element of a mask)."""
        if num_classes is not None:
            data_targets.check_classes(self, num_classes)

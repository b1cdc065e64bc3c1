"""The epoch sampler: an order that depends only on (seed, epoch, pass), shared out to ranks;
and the transformed view of a dataset that the loaders read in that order."""

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from utils.util import derive_seed


class EpochSampler(Sampler[int]):
    """Yields `indices` in an order that depends only on (seed, epoch, pass), never on global RNG.

    One sequence for all ranks together is drawn from a generator seeded by (seed, epoch, pass):
    `indices` in order (shuffle False); a permutation of them (shuffle True); uniform draws
    (replacement True); or draws with probability proportional to `weights`, with replacement
    (what torch's WeightedRandomSampler does). It is num_samples long, by default
    len(indices); without replacement a longer one is several permutations in a row.

    Each rank takes every num_replicas-th position of that sequence, so the shares are disjoint
    and weighted draws keep their class balance over all ranks together. `pad` repeats the
    first positions until every rank has the same count (training needs equal step counts under
    DDP); evaluation leaves it off so every sample is counted exactly once. `seeded` (default:
    shuffle; the training sampler's is always on) yields each index with its augmentation's
    seed and flip (SeededIndex); evaluation's plain indices have none.
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
        replacement: bool = False,
        num_samples: int | None = None,
        weights: Sequence[float] | None = None,
        seeded: bool | None = None,
    ) -> None:
        # Draws of any kind are random: without shuffle there is only the given order.
        assert shuffle or (not replacement and num_samples is None and weights is None)
        self.indices = np.asarray(indices, dtype=np.int64)
        self.shuffle = shuffle
        # Training (by default: a shuffled order): each index carries its augmentation's seed.
        self.seeded = shuffle if seeded is None else seeded
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.pad = pad
        self.replacement = replacement
        # Nothing to draw from gives nothing, whatever num_samples asks for.
        self.num_samples = 0 if len(self.indices) == 0 else (num_samples or len(self.indices))
        self.weights = None if weights is None else np.asarray(weights, dtype=np.float64)
        self.epoch = 0
        self.pass_index = 0
        self.skip = 0
        # Handed to the DataLoader, which draws its worker base seed from it rather than from
        # the global RNG: worker seeds follow (seed, epoch, pass), and a mid-epoch resume that
        # restores the global RNG state is not thrown off by a new iterator's seed draw.
        self.generator = torch.Generator()
        # Alternating flips (data_loader.args.flip): each training sample's flip in passes
        # where flips_odd() is False (alternating_flips); None: the transform draws its own.
        self.flips: np.ndarray | None = None

    def flips_odd(self) -> bool:
        """Whether this (epoch, pass) flips the samples that `flips` leaves as they are."""
        return (self.epoch + self.pass_index) % 2 == 1

    def set_epoch(self, epoch: int, pass_index: int = 0, skip: int = 0) -> None:
        """Choose the order for this epoch (and pass, when an epoch spans several passes).

        `skip`: the first positions of the pass's order that all ranks together have already
        trained (a mid-epoch resume, in any batch geometry); the rest is shared out.
        """
        self.epoch = epoch
        self.pass_index = pass_index
        self.skip = skip
        self.generator.manual_seed(derive_seed(self.seed, epoch, pass_index, self.rank))

    def global_order(self, epoch: int, pass_index: int = 0) -> np.ndarray:
        """The sequence of (epoch, pass) for all ranks together, before padding and sharding."""
        if not self.shuffle or self.num_samples == 0:
            return self.indices
        generator = np.random.default_rng([self.seed, epoch, pass_index])
        count = len(self.indices)
        if self.weights is not None:
            probabilities = self.weights / self.weights.sum()
            positions = generator.choice(count, size=self.num_samples, p=probabilities)
        elif self.replacement:
            positions = generator.integers(count, size=self.num_samples)
        else:
            num_permutations = -(-self.num_samples // count)
            permutations = [generator.permutation(count) for _ in range(num_permutations)]
            positions = np.concatenate(permutations)[: self.num_samples]
        return self.indices[positions]

    def order_signature(self) -> str:
        """A digest of what global_order draws with besides (epoch, pass) and the indices: the
        seed, the draw and its weights. A mid-epoch resume under another would not find the rest
        of its epoch in the new order (utils/state/resume.py refuses it)."""
        drawn = (self.seed, self.replacement, self.num_samples) if self.shuffle else ()
        digest = hashlib.sha256(repr((self.shuffle, *drawn)).encode())
        if self.shuffle and self.weights is not None:  # as global_order draws with them
            digest.update((self.weights / self.weights.sum()).tobytes())
        return digest.hexdigest()[:16]

    @property
    def start(self) -> int:
        """This rank's indices of the pass skipped (exact when `skip` is a multiple of the
        number of ranks, as when the geometry did not change)."""
        return self.skip // self.num_replicas

    def positions(self) -> np.ndarray:
        """This rank's positions in the pass's global_order (num_samples long), from `start` on."""
        count = self.num_samples
        positions = np.arange(self.skip, count)
        if self.pad and len(positions) % self.num_replicas:
            # The padding repeats the pass's first positions, with or without a skip that is a
            # multiple of the ranks: a resume shares out exactly what the epoch would have.
            extra = self.num_replicas - len(positions) % self.num_replicas
            positions = np.concatenate([positions, np.resize(np.arange(count), extra)])
        return positions[self.rank :: self.num_replicas]

    def pass_indices(self) -> np.ndarray:
        """The indices iteration yields, as one int64 array: what a batch-at-a-time pipeline
        needs, without the Python object per sample that iteration makes (a list of a
        45,000-sample pass costs 70-250 ms, the array 1 ms)."""
        return self.global_order(self.epoch, self.pass_index)[self.positions()]

    def __iter__(self) -> Any:
        mine = self.positions()
        indices = self.global_order(self.epoch, self.pass_index)[mine].tolist()
        if not self.seeded:  # evaluation: nothing is augmented
            return iter(indices)
        # Training: each sample with the seed its augmentation draws from, a function of
        # (seed, epoch, pass, position in the pass's order).
        base = derive_seed(self.seed, self.epoch, self.pass_index, 0xA06)
        if self.flips is None:
            flips = [None] * len(indices)
        else:
            flips = (self.flips[indices] ^ self.flips_odd()).tolist()
        return iter(
            SeededIndex(index, mix(base, position), flip)
            for index, position, flip in zip(indices, mine.tolist(), flips, strict=True)
        )

    def share(self, skip: int = 0) -> int:
        """This rank's number of indices in the pass after the first `skip` positions."""
        rest = max(self.num_samples - skip, 0)
        if self.pad:
            return -(-rest // self.num_replicas)
        return len(range(self.rank, rest, self.num_replicas))

    def __len__(self) -> int:
        return self.share()


class SeededIndex(int):
    """A training sample's index, carrying the seed its augmentation draws from: the same in a
    worker process (persistent or not) as in the main process, in a rerun and after a resume,
    also one inside an epoch or with another batch geometry; and, with alternating flips,
    whether the sample is flipped (None: the transform decides)."""

    seed: int
    flip: bool | None

    def __new__(cls, index: int, seed: int, flip: bool | None = None) -> "SeededIndex":
        value = super().__new__(cls, index)
        value.seed, value.flip = seed, flip
        return value

    def __reduce__(self) -> tuple:  # to worker processes, seed and flip included
        return SeededIndex, (int(self), self.seed, self.flip)


def alternating_flips(num_samples: int, seed: int) -> np.ndarray:
    """(num_samples,) bool: a seeded coin per sample, whether it is flipped in an even pass
    ((epoch + pass) even); odd passes flip the others. Every sample is then seen both ways in
    any two passes in a row, which random flips leave to chance."""
    return np.random.default_rng([seed, 0xF11B]).random(num_samples) < 0.5


def mix(base: int, position: int) -> int:
    """A 63-bit seed from a base seed and a position (splitmix64's finaliser): cheap per sample,
    and neighbouring positions get unrelated seeds."""
    value = (base + position * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (value ^ (value >> 31)) >> 1


class TransformedDataset(Dataset):
    """A view of `dataset` with `transform` applied to each input, or `pair_transform` to each
    (input, target) together (BaseDataLoader.pair_transform); shares the underlying data.
    A SeededIndex (training) seeds the transforms' random draws, apart from the process's own
    random numbers (dropout keeps its stream): a pair's augmentation is a function of (seed,
    epoch, pass, position) in every process, after a resume too."""

    def __init__(
        self,
        dataset: Dataset,
        transform: Callable,
        pair_transform: Callable[[Any, Any], tuple[Any, Any]] | None = None,
    ) -> None:
        self.dataset = dataset
        self.transform = transform
        self.pair_transform = pair_transform

    def __len__(self) -> int:
        return len(self.dataset)

    def apply(self, image: Any, target: Any) -> tuple[Any, Any]:
        """(input, target) through pair_transform, else (transform(input), target)."""
        if self.pair_transform is not None:
            return self.pair_transform(image, target)
        return self.transform(image), target

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        image, target = self.dataset[index]
        seed = getattr(index, "seed", None)
        if seed is None:
            return self.apply(image, target)
        # The CPU generator alone, which the transforms draw from, its state put back after:
        # torch.manual_seed also seeds every other device's (200 us, a sixth of decoding a CIFAR
        # JPEG), and torch.random.fork_rng costs 20 us a call, 5 % of a sample's whole path.
        generator = torch.default_generator
        state = generator.get_state()
        try:
            generator.manual_seed(seed)
            image, target = self.apply(image, target)
        finally:
            generator.set_state(state)
        # Alternating flips: after the transform (crop, then flip, as the device pipeline does).
        # They flip the input alone (ImageDataLoader's classifiers set them, not pair data).
        return (image.flip(-1) if getattr(index, "flip", None) else image), target

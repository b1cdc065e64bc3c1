"""The arithmetic of a data set's splits: the seeded validation share, the stratified k-fold
deal, and a cheap identity of the samples a split holds (BaseDataLoader uses these)."""

import hashlib
import os
from typing import Any

import numpy as np

from utils.util import DataError


def validation_count(num_samples: int, share: float | int) -> int:
    """How many of num_samples validation_split `share` holds out (a fraction, or a count); a
    share that rounds to no sample, or leaves no training sample, is refused."""
    num_val = round(num_samples * share) if isinstance(share, float) else share
    if num_val >= num_samples:
        raise DataError(
            f"data_loader.args.validation_split: {share} leaves no training samples out of "
            f"{num_samples}"
        )
    if share and num_val == 0:  # a fraction too small for the data: not an empty split
        raise DataError(
            f"data_loader.args.validation_split: {share} of {num_samples} training samples is "
            "no sample; raise it, or give a number of samples"
        )
    return num_val


def holdout_split(num_samples: int, num_val: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) indices: num_val of num_samples held out by a permutation seeded by
    seed alone, so the split is the same on every rank and in test.py."""
    order = np.random.default_rng([seed, 0x5EED]).permutation(num_samples)
    return np.sort(order[num_val:]), np.sort(order[:num_val])


def stratified_fold(
    labels: np.ndarray, folds: int, fold: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) indices of fold `fold` of `folds`: the samples dealt out class by class,
    in an order seeded by seed, to the folds in turn. The folds are disjoint, cover the split,
    differ in size by at most one sample and hold each class's share to within one sample."""
    shuffled = np.random.default_rng([seed, 0xF01D]).permutation(len(labels))
    dealt = shuffled[np.argsort(labels[shuffled], kind="stable")]  # stable: seeded within a class
    validation = np.sort(dealt[fold::folds])
    return np.setdiff1d(dealt, validation), validation


def class_weights(
    labels: np.ndarray, num_classes: int, given: list[float] | None, location: str
) -> np.ndarray:
    """Weight of one sample of each class for the weighted sampler: `given`
    (data_loader.args.class_weights), else the inverse of the class's count among `labels`, so
    that every class is drawn equally often."""
    counts = np.bincount(labels, minlength=num_classes)
    if given is None:
        weights = np.zeros(len(counts))
        np.divide(1.0, counts, out=weights, where=counts > 0)
    elif len(given) != len(counts):
        raise DataError(
            f"data_loader.args.class_weights: {len(given)} weights, but {location} has "
            f"{len(counts)} classes"
        )
    else:
        weights = np.asarray(given, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # judged below, not warned about
        per_class = weights * counts
        total = float(np.sum(per_class))
    if not np.any(per_class > 0):
        raise DataError("data_loader.args.class_weights: every training sample has weight 0")
    # The sampler divides by the weights' sum over the samples: an infinite one (or one past
    # float's range) makes every probability nan or 0, which numpy's draw fails on.
    if not np.isfinite(total):
        raise DataError(
            f"data_loader.args.class_weights: {given} times the class counts sum to {total}, "
            "not a finite number; give finite weights of a smaller scale (only ratios matter)"
        )
    return weights


def sample_ids(dataset: Any) -> list[str] | None:
    """What tells a data set's samples apart: an image folder's file names (relative to its root)
    with their labels, else its labels when it has `targets`, else None."""
    samples = getattr(dataset, "samples", None)
    if samples is not None:
        root = str(getattr(dataset, "root", ""))
        prefix = os.path.join(root, "") if root else ""
        # The path under the root: the root cut off where the path was joined to it (as
        # ImageFolder's are), as relpath gives it without its normalising (36 ms a 10,000 files).
        return [
            f"{path[len(prefix) :] if path.startswith(prefix) else os.path.relpath(path, root)}\0{label}"
            for path, label in samples
        ]
    targets = getattr(dataset, "targets", None)
    return None if targets is None else [str(int(label)) for label in targets]


def split_digest(split: str, size: int, indices: np.ndarray, ids: list[str] | None) -> dict:
    """{"num_samples", "digest"}: how many samples of `split` (of `size` in all) a split holds,
    and a hash of which ones (their indices and ids)."""
    hashed = hashlib.sha256(f"{split} {size}\n".encode())
    hashed.update(np.ascontiguousarray(indices, dtype=np.int64).tobytes())
    if ids is not None:
        hashed.update("\n".join(ids[index] for index in indices).encode())
    return {"num_samples": len(indices), "digest": hashed.hexdigest()[:32]}

"""What the log says about the data before training: sizes, class counts, sampler, warnings."""

import logging
from typing import TYPE_CHECKING

import numpy as np
from torch.utils.data import Sampler

from utils.data import targets as data_targets
from utils.data.sampler import EpochSampler

if TYPE_CHECKING:
    from base.base_data_loader import BaseDataLoader

# Class counts are listed one by one up to this many classes; beyond, only the extremes.
MAX_LISTED_CLASSES = 20


def log_data_summary(
    data: "BaseDataLoader", logger: logging.Logger, epoch: int, used: Sampler | None = None
) -> None:
    """Log the training and validation data (sizes, class counts), the sampler and, for weighted
    sampling, the classes drawn in `epoch`; warn about a class missing from the validation data
    and about samples that are in both. `used`: the training loader's sampler (default: the
    template's own)."""
    used = data.train_sampler() if used is None else used
    names = data.class_names()  # none for data without classes (e.g. denoising)

    def counts(split: str, indices: np.ndarray) -> str:
        if not names:
            return f"{len(indices)} samples"
        # Per class: its samples (one label each) or its occurrences in the targets (masks).
        found = data_targets.class_counts(data, split, indices, len(names))
        unit = "" if data_targets.has_sample_labels(data, split) else "occurrences in the targets"
        return class_counts(found, names, len(indices), unit)

    train_indices, _ = data.split_indices()
    logger.info("Training data: %s", counts("train", train_indices))
    if names:
        # Logged as a count of 0, it was easy to miss: a validation_split can take every sample
        # of a rare class, and the weighted sampler then silently draws the others alone.
        found = data_targets.class_counts(data, "train", train_indices, len(names))
        missing = missing_classes(found, names)
        if missing:
            logger.warning(
                "The training data has no samples of %s: the model is never trained on them "
                "(no sampler can draw them).",
                missing,
            )
    source = data.validation_source()
    if source is not None:
        split, indices = source
        logger.info(
            "Validation data (%s; never augmented): %s",
            describe_validation(data),
            counts(split, indices),
        )
        found = data_targets.class_counts(data, split, indices, len(names)) if names else []
        missing = missing_classes(found, names)
        if missing:
            logger.warning(
                "The validation data has no samples of %s; their accuracy is not measured.",
                missing,
            )
        # Splits made from one set must not share samples (a subclass may split its own way).
        shared = np.intersect1d(train_indices, indices) if split == "train" else []
        if len(shared):
            logger.warning(
                "Training and validation data share %d samples (e.g. index %d of the training "
                "split): the validation metrics will be too optimistic.",
                len(shared),
                shared[0],
            )
    if not isinstance(used, EpochSampler):  # a loader that brings its own sampler or stream
        logger.info("Sampler: %s, from %s.train_loader", type(used).__name__, type(data).__name__)
        return
    sampler = data.train_sampler()
    logger.info("Sampler: %s", describe_sampler(data, sampler))
    if data.sampler == "weighted":
        drawn = data.labels("train")[sampler.global_order(epoch)]
        logger.info(
            "Classes drawn in epoch %d (one pass, %d draws over all ranks): %s",
            epoch,
            len(drawn),
            class_shares(drawn, names),
        )


def missing_classes(counts: np.ndarray, names: list[str]) -> str:
    """'2 class(es): cat, dog' for the classes of count 0 (the first 20 listed); '' for none."""
    missing = [name for label, name in enumerate(names) if not counts[label]]
    if not missing:
        return ""
    listed = ", ".join(missing[:MAX_LISTED_CLASSES])
    return (
        f"{len(missing)} class(es): {listed}{', ...' if len(missing) > MAX_LISTED_CLASSES else ''}"
    )


def describe_validation(data: "BaseDataLoader") -> str:
    """Where the validation data comes from, e.g. 'fold 1 of 5 of the training split, stratified'."""
    if data.folds:
        return f"fold {data.fold} of {data.folds} of the training split, stratified"
    if data.validation_split:
        return f"validation_split {data.validation_split} of the training split"
    return data.location("val")


def describe_sampler(data: "BaseDataLoader", sampler: EpochSampler) -> str:
    """The sampler's name and what one pass over the training data draws."""
    count = len(sampler.indices)
    if data.sampler == "sequential":
        text = f"sequential: the {count} training samples in order"
    elif data.sampler == "weighted":
        weights = "class_weights" if data.class_weights else "inverse class frequency"
        text = f"weighted ({weights}): {sampler.num_samples} draws with replacement per pass"
    elif sampler.replacement:
        text = f"{data.sampler}: {sampler.num_samples} uniform draws with replacement per pass"
    elif sampler.num_samples == count:
        text = f"{data.sampler}: a new permutation of the {count} training samples each pass"
    else:
        text = (
            f"{data.sampler}: {sampler.num_samples} samples per pass, from permutations of {count}"
        )
    if data.num_replicas > 1:
        step = data.num_replicas
        text += f"; rank r of {step} takes positions r, r + {step}, r + {2 * step}, ..."
    return text


def class_counts(counts: np.ndarray, names: list[str], num_samples: int, unit: str = "") -> str:
    """'N samples; per class: cat 3, dog 5' from each class's count (for many classes only the
    fewest and the most); `unit` says what is counted when it is not samples."""
    counts = counts[: len(names)]  # labels past the names are refused by the label check
    if len(names) <= MAX_LISTED_CLASSES:
        per_class = ", ".join(
            f"{name} {count}" for name, count in zip(names, counts.tolist(), strict=False)
        )
    else:
        fewest, most = int(np.argmin(counts)), int(np.argmax(counts))
        per_class = (
            f"from {counts[fewest]} ({names[fewest]}) to {counts[most]} ({names[most]}) "
            f"over {len(names)} classes"
        )
    return f"{num_samples} samples; per class{f' ({unit})' if unit else ''}: {per_class}"


def class_shares(labels: np.ndarray, names: list[str]) -> str:
    """'cat 49.8%, dog 50.2%': each class's share of `labels` (for many classes the extremes)."""
    shares = 100 * np.bincount(labels, minlength=len(names)) / max(len(labels), 1)
    if len(names) <= MAX_LISTED_CLASSES:
        return ", ".join(
            f"{name} {share:.1f}%" for name, share in zip(names, shares.tolist(), strict=False)
        )
    fewest, most = int(np.argmin(shares)), int(np.argmax(shares))
    return (
        f"from {shares[fewest]:.2f}% ({names[fewest]}) to {shares[most]:.2f}% ({names[most]}) "
        f"over {len(names)} classes"
    )

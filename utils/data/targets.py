"""What the targets of a data set hold, read through the loader's target_classes: the one label
per sample that the weighted sampler and stratified folds need, the class counts of the data
summary (samples for labels, every element for masks, per item for box lists) and the label
check against the model's outputs. Any target shape: no task is known here."""

from typing import TYPE_CHECKING

import numpy as np

from utils.util import DataError

if TYPE_CHECKING:
    from base.base_data_loader import BaseDataLoader


def split_classes(data: "BaseDataLoader", split: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets): target_classes of every sample of `split` one after the other, sample
    i's being values[offsets[i] : offsets[i + 1]]. Read from the dataset's `targets`
    (torchvision's name) when it has them (labels (N,) take no loop), else by loading every
    sample once. Cached per split."""
    cache = data._target_classes
    if split not in cache:
        dataset = data.dataset(split)
        targets = getattr(dataset, "targets", None)
        if targets is None:
            targets = [target for _, target in dataset]
        try:
            labels = np.asarray(targets)
        except ValueError:  # ragged: e.g. masks of several sizes
            labels = None
        plain = labels is not None and labels.ndim == 1 and labels.dtype.kind in "iu"
        if plain and (data.ignore_index is None or not np.any(labels == data.ignore_index)):
            cache[split] = labels.astype(np.int64), np.arange(len(labels) + 1)
        else:
            cache[split] = joined([target_classes(data, split, target) for target in targets])
    return cache[split]


def target_classes(data: "BaseDataLoader", split: str, target: object) -> np.ndarray:
    """data.target_classes(target), a DataError naming the split when it is not class indices."""
    try:
        classes = data.target_classes(target)
        reason = f"{classes.dtype} of shape {classes.shape}"
    except (TypeError, ValueError) as error:
        classes, reason = None, str(error)
    if classes is None or classes.ndim != 1 or classes.dtype.kind not in "iu":
        raise DataError(
            f"{data.location(split)}: a target is not class indices ({reason}); override "
            "target_classes(target) for targets of your own kind"
        )
    return classes.astype(np.int64, copy=False)


def joined(classes: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of a list of 1-D arrays."""
    offsets = np.zeros(len(classes) + 1, np.int64)
    offsets[1:] = np.cumsum([len(found) for found in classes])
    values = np.concatenate(classes) if classes else np.zeros(0, np.int64)
    return values, offsets


def has_sample_labels(data: "BaseDataLoader", split: str) -> bool:
    """Whether every target of `split` holds exactly one class (a classifier's label)."""
    return bool(np.all(np.diff(split_classes(data, split)[1]) == 1))


def sample_labels(data: "BaseDataLoader", split: str) -> np.ndarray:
    """(N,) int64: the one class of each sample of `split`; other targets (masks, lists of
    boxes) are refused in one line, for what needs one label per sample."""
    values, offsets = split_classes(data, split)
    sizes = np.diff(offsets)
    if np.any(sizes != 1):
        index = int(np.argmax(sizes != 1))
        raise DataError(
            f"{data.location(split)}: sample {index}'s target holds {sizes[index]} class "
            "indices, not one label; the weighted sampler needs one per sample (choose "
            "data_loader.args.sampler 'random')"
        )
    return values


def class_counts(
    data: "BaseDataLoader", split: str, indices: np.ndarray, num_classes: int
) -> np.ndarray:
    """(num_classes,) int64: how often each class occurs in the targets of samples `indices`
    (once per sample for labels; per element for a mask). Classes past num_classes extend it."""
    values, offsets = split_classes(data, split)
    if np.all(np.diff(offsets) == 1):  # one class per sample: no loop
        return np.bincount(values[indices], minlength=num_classes)
    found = [values[offsets[index] : offsets[index + 1]] for index in indices.tolist()]
    return np.bincount(joined(found)[0], minlength=num_classes)


def check_classes(data: "BaseDataLoader", num_classes: int) -> None:
    """Refuse training targets with a class outside 0..num_classes-1 (ignore_index aside).
    Floating-point targets are left to the first-batch check, which refuses them for a
    classifier naming the batch's shapes and dtypes (and the model, if it refuses them first)."""
    if len(data.dataset("train")) and np.asarray(data.dataset("train")[0][1]).dtype.kind == "f":
        return
    values = split_classes(data, "train")[0]
    if values.min(initial=0) < 0:
        ignore = f" (ignore_index is {data.ignore_index})" if data.ignore_index is not None else ""
        raise DataError(
            f"{data.location('train')}: class index {int(values.min())} in the targets{ignore}; "
            "classes are 0 to num_classes - 1"
        )
    names = data.class_names()
    num_data_classes = max(len(names), int(values.max(initial=-1)) + 1)
    if num_data_classes > num_classes:
        raise DataError(
            f"{data.location('train')}: {num_data_classes} classes, but arch.args.num_classes "
            f"is {num_classes}: labels {num_classes} to {num_data_classes - 1} are outside "
            f"the model's outputs; set arch.args.num_classes to {num_data_classes}"
        )
    if names and values.max(initial=-1) >= len(names):  # else left out of summaries, unnamed
        raise DataError(
            f"{data.location('train')}: class index {int(values.max())} in the targets, but "
            f"{len(names)} class names ({', '.join(names[:5])}); name every class"
        )

"""Batches for the engine: the order of an epoch, resuming inside it, moving to the device, and
the checks on the loaders."""

import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from utils.data.sampler import EpochSampler
from utils.distributed.process_group import all_reduce_max, world_size
from utils.util import UserError

if TYPE_CHECKING:
    from parse_config import ConfigParser


def global_batch(config: "ConfigParser", world_size: int) -> int:
    """Samples per optimizer step: batch_size per process x processes x grad_accum_steps."""
    per_process = config["data_loader"]["args"]["batch_size"]
    return per_process * world_size * config["trainer"]["grad_accum_steps"]


@runtime_checkable
class Loader(Protocol):
    """What the engine reads of a training or evaluation loader. torch's DataLoader has it, and
    so do the device pipeline's DeviceBatches and device decoding's DeviceDecodedBatches
    (tests/test_loader_protocol.py checks all three); a loader of your own needs it too.

    sampler: the order of the samples (the template's loaders: an EpochSampler, which a resume
    sets to skip what was done; another sampler is given set_epoch when it has one).
    batch_size: samples per batch of this process; drop_last: whether a pass's short last batch
    is left out. dataset: the per-sample view (len() and [index]: the data summary and the
    TensorBoard image grid read it). len(): batches per pass (a loader without one needs
    trainer.len_epoch). Iterating yields the batches training_step and validation_step get.
    """

    sampler: Any
    batch_size: int | None
    drop_last: bool
    dataset: Any

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...


def lr_scale(config: "ConfigParser", world_size: int) -> float:
    """The factor optimizer.reference_batch_size applies to every learning rate: global batch /
    reference_batch_size (the linear scaling rule, Goyal et al., 2017); 1 without it."""
    reference = config["optimizer"]["reference_batch_size"]
    return 1.0 if reference is None else global_batch(config, world_size) / reference


def batch_geometry(config: "ConfigParser", loader: Loader) -> dict:
    """What a mid-epoch position and the learning rates are counted in: this rank's batch size,
    the processes, the accumulation, trainer.len_epoch and the global batch."""
    return {
        "batch_size": loader.batch_size,
        "world_size": world_size(),
        "grad_accum_steps": config["trainer"]["grad_accum_steps"],
        "len_epoch": config["trainer"]["len_epoch"],
        "global_batch": global_batch(config, world_size()),
        # Not a geometry: the settings of the epoch's order, which a mid-epoch resume keeps.
        "order": (
            loader.sampler.order_signature() if isinstance(loader.sampler, EpochSampler) else None
        ),
    }


def epoch_batches(
    loader: Loader,
    epoch: int,
    first_batch: int,
    len_epoch: int,
    at_resume_point: Callable[[], None],
    skip_samples: int | None = None,
) -> Iterator[Any]:
    """Batches first_batch+1 .. len_epoch of `epoch`; a new pass over the loader starts when it
    runs out. Any sampler works: the template's EpochSampler skips the batches already done by
    index (nothing is loaded for them); any other is given set_epoch (if it has one) and its
    batches already done are loaded and dropped. at_resume_point() is called once, right
    before the first batch after them (a resume restores its random numbers there).

    skip_samples (a resume in another batch geometry, one pass, EpochSampler only): the rest
    of the pass after that many samples of its order, in this loader's batches.
    """
    sampler = loader.sampler
    if skip_samples is not None:
        sampler.set_epoch(epoch, 0, skip=skip_samples)
        at_resume_point()
        yield from loader
        return
    per_pass = len(loader) if has_length(loader) else None
    pass_index, skip = divmod(first_batch, per_pass) if per_pass else (0, first_batch)
    num_passes = -(-len_epoch // per_pass) if per_pass else 1
    remaining = len_epoch - first_batch
    while remaining > 0:
        if isinstance(sampler, EpochSampler):  # its order is a function of (seed, epoch, pass)
            done = skip * loader.batch_size * sampler.num_replicas  # by all ranks together
            sampler.set_epoch(epoch, pass_index, skip=done)
            skip = 0
        elif hasattr(sampler, "set_epoch"):  # e.g. DistributedSampler: one order per pass
            sampler.set_epoch((epoch - 1) * num_passes + pass_index + 1)
        batches = iter(loader)
        num_seen = sum(1 for _ in itertools.islice(batches, skip))  # loaded and dropped
        skip -= num_seen
        if first_batch and skip == 0:
            at_resume_point()
            first_batch = 0
        for batch in batches:
            yield batch
            num_seen, remaining = num_seen + 1, remaining - 1
            if remaining == 0:
                return
        if num_seen == 0:
            raise UserError("the training data yielded no batch in a whole pass")
        pass_index += 1


def remaining_batches(loader: Loader, skip_samples: int) -> int:
    """This rank's batches of a pass after `skip_samples` samples of its order (EpochSampler)."""
    share = loader.sampler.share(skip_samples)
    return share // loader.batch_size if loader.drop_last else -(-share // loader.batch_size)


def to_device(batch: Any, device: torch.device, channels_last: bool) -> Any:
    """`batch` (tensors in tuples, lists and dicts) on `device`; 4-d float tensors (images)
    in channels_last memory format when asked."""
    if isinstance(batch, torch.Tensor):
        batch = batch.to(device, non_blocking=True)
        if channels_last and batch.dim() == 4 and batch.is_floating_point():
            batch = batch.contiguous(memory_format=torch.channels_last)
        return batch
    if isinstance(batch, dict):
        return {key: to_device(value, device, channels_last) for key, value in batch.items()}
    if isinstance(batch, list | tuple):
        moved = [to_device(value, device, channels_last) for value in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


def all_finite(loss: torch.Tensor) -> bool:
    """Whether the loss is finite on every rank (a host sync: trainer.nonfinite "skip" only)."""
    return not all_reduce_max((~torch.isfinite(loss.detach())).int()).item()


def has_length(loader: Any) -> bool:
    try:
        len(loader)
    except TypeError:  # an IterableDataset without __len__
        return False
    return True


def check_loaders(
    train: Loader, val: Loader | None, monitor_key: str, len_epoch: int | None
) -> None:
    """Refuse data that cannot train, decided on the global counts so that every rank agrees."""
    if num_samples(train) == 0:
        raise UserError("the training split is empty: nothing to train on")
    if val is not None and num_samples(val) == 0:
        raise UserError("the validation split is empty: nothing to validate on")
    if monitor_key.startswith("val/") and val is None:
        raise UserError(
            f"trainer.monitor watches {monitor_key} but there is no validation data: "
            "set data_loader.args.validation_split or monitor a train/ metric"
        )
    if len_epoch is None and not has_length(train):
        raise UserError("the training data has no length: set trainer.len_epoch")


def num_samples(loader: Loader) -> int | None:
    """Samples in a loader over all ranks (None: not known, e.g. an IterableDataset)."""
    indices = getattr(loader.sampler, "indices", None)  # EpochSampler: all ranks' indices
    if indices is not None:
        return len(indices)
    return len(loader.dataset) if has_length(loader.dataset) else None

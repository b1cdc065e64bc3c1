"""Tuning through the engine (tune.py): the learning-rate range test, and the largest batch
that fits. Both run the trainer's own training_step, accumulation, autocast and GradScaler,
clipping and gradient synchronisation (DDP, FSDP), and put back everything they change: the
model, the optimizer, the GradScaler and the random number generators are those of a fresh run
afterwards."""

import contextlib
import copy
import ctypes
import ctypes.util
import gc
import itertools
import re
from collections.abc import Callable, Iterator, Sized
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from base.evaluation import averaged_over_views, run_validation_step
from utils.data.batches import epoch_batches, to_device
from utils.distributed.process_group import all_reduce_max, all_reduce_sum, world_size
from utils.distributed.sharding import gradient_sync
from utils.optim.lr_range import RangeTest, run_range_test
from utils.util import get_rng_state, set_rng_state

if TYPE_CHECKING:
    from base.base_trainer import BaseTrainer


@contextlib.contextmanager
def restored(trainer: "BaseTrainer") -> Iterator[None]:
    """The trainer's model, optimizer, GradScaler and RNG states as they were before the block."""
    saved = {
        "model": copy.deepcopy(trainer.model.state_dict()),
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
        "scaler": copy.deepcopy(trainer.scaler.state_dict()),
        "rng": get_rng_state(trainer.device),
    }
    try:
        yield
    finally:
        trainer.model.load_state_dict(saved["model"])
        trainer.optimizer.load_state_dict(saved["optimizer"])
        trainer.scaler.load_state_dict(saved["scaler"])
        set_rng_state(saved["rng"], trainer.device)
        trainer.optimizer.zero_grad(set_to_none=True)


def lr_range_test(trainer: "BaseTrainer", lrs: list[float]) -> RangeTest:
    """Train one optimizer step per learning rate of `lrs` (each group keeps its ratio to the
    first group's rate) until the loss diverges; then restore the trainer's state."""
    with restored(trainer):
        return run_range_test(engine_step(trainer, len(lrs)), lrs)


def engine_step(trainer: "BaseTrainer", num_steps: int) -> Callable[[float], float]:
    """step(lr): one optimizer step (an accumulation group of batches) at `lr`; the loss of
    its batches, averaged over them and over the ranks (a host sync: this is a tuning tool)."""
    accumulate = trainer.options["grad_accum_steps"]
    batches = epoch_batches(
        trainer.train_loader, 1, 0, num_steps * accumulate, lambda: None
    )  # epoch 1's order, across passes if need be
    rates = config_rates(trainer)
    ratios = [rate / rates[0] for rate in rates]
    trainer.model.train()

    def step(lr: float) -> float:
        for group, ratio in zip(trainer.optimizer.param_groups, ratios, strict=True):
            group["lr"] = lr * ratio
        return float(train_step(trainer, list(itertools.islice(batches, accumulate))))

    return step


def config_rates(trainer: "BaseTrainer") -> list[float]:
    """Each group's rate that the config's rates set, as the run trains it: the peak of
    OneCycleLR and of CyclicLR, else the rate before a warmup's first factor. Not the rates
    now: CyclicLR starts each group at its base_lr, which may be 0."""
    scheduler = trainer.lr_scheduler
    for part in getattr(scheduler, "_schedulers", [scheduler]):  # SequentialLR: a warmup first
        if isinstance(part, torch.optim.lr_scheduler.CyclicLR):
            return list(part.max_lrs)
    groups = trainer.optimizer.param_groups
    return [group.get("max_lr", group.get("initial_lr", group["lr"])) for group in groups]


def train_step(trainer: "BaseTrainer", group: list[Any]) -> torch.Tensor:
    """One optimizer step on a group of batches (accumulated); their mean loss over the ranks."""
    total = torch.zeros((), device=trainer.device)
    for index, batch in enumerate(group):
        batch = to_device(batch, trainer.device, trainer.options["channels_last"])
        with gradient_sync(trainer.model, index == len(group) - 1):
            with torch.autocast(
                trainer.device.type, trainer.amp_dtype, trainer.amp_dtype is not None
            ):
                loss = trainer.training_step(batch).loss
            trainer.scaler.scale(loss / len(group)).backward()
        total += loss.detach().float() / len(group)
    if trainer.options["grad_clip"] is not None:
        trainer.scaler.unscale_(trainer.optimizer)
        nn.utils.clip_grad_norm_(trainer.model.parameters(), trainer.options["grad_clip"])
    trainer.scaler.step(trainer.optimizer)
    trainer.scaler.update()
    trainer.optimizer.zero_grad(set_to_none=True)
    return all_reduce_sum(total) / world_size()


def largest_fitting(fits: Callable[[int], bool], start: int, limit: int) -> int | None:
    """The largest n <= limit with fits(n), for fits true up to some size and false above it:
    doubling from `start` until it fails, then bisecting (halving first when `start` fails).
    None when not even 1 fits."""
    low, high = 0, None  # fits(low) (0: nothing yet), not fits(high)
    size = min(start, limit)
    while high is None:
        if fits(size):
            low = size
            if size == limit:
                return size
            size = min(2 * size, limit)
        else:
            high = size
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low or None


def largest_batch(trainer: "BaseTrainer", budget: int | None, limit: int) -> int | None:
    """The largest per-process batch whose training step, and validation step when there is
    validation data, fit: without running out of CUDA memory, and within `budget` bytes of peak
    memory when given (CUDA: torch's allocator; the CPU: the process's peak resident memory,
    Linux). The trainer's state is restored."""
    train_batch = batch_maker(trainer.train_loader)
    # Validation runs at the same batch size: without gradients it mostly needs less, but not
    # always (test-time augmentation's views, a large output per sample).
    loader = trainer.val_loader
    val_batch = None if loader is None else batch_maker(loader)

    def within(step: Callable[[Any], Any], make: Callable[[int], Any], size: int) -> bool:
        batch = make(size)
        try:
            with restored(trainer), peak_memory(trainer.device) as peak:
                step(batch)
            ok = budget is None or peak() <= budget
        except torch.OutOfMemoryError:
            ok = False
        del batch
        if trainer.device.type == "cuda":
            torch.cuda.empty_cache()
        return ok

    def fits(size: int) -> bool:
        ok = within(lambda batch: train_step(trainer, [batch]), train_batch, size)
        if ok and val_batch is not None:
            ok = within(lambda batch: validation_step(trainer, batch), val_batch, size)
        # Every rank must take the same answer: a batch too big for one is too big.
        return not all_reduce_max(torch.tensor(int(not ok), device=trainer.device))

    trainer.model.train()
    return largest_fitting(fits, trainer.train_loader.batch_size, limit)


@torch.no_grad()
def validation_step(trainer: "BaseTrainer", batch: Any) -> None:
    """One validation step as evaluate() runs it: evaluation mode, no gradients, the views of
    test-time augmentation; the model back in training mode afterwards."""
    trainer.model.eval()
    try:
        with averaged_over_views(trainer, trainer.model):
            batch = to_device(batch, trainer.device, trainer.options["channels_last"])
            run_validation_step(trainer, batch)
    finally:
        trainer.model.train()


def samples_per_pass(loader: Any) -> int | None:
    """This process's training samples in a pass over `loader` (None: its sampler has no len)."""
    sampler = getattr(loader, "sampler", None)
    return len(sampler) if isinstance(sampler, Sized) else None


def batch_maker(loader: Any) -> Callable[[int], Any]:
    """make(size): a batch of `size` samples, the loader's first ones repeated. Through the
    loader's collate_fn where it has one (torch's DataLoader), so that what a batch holds per
    sample (detection's list of target dicts) has one item per sample; else (the device
    pipelines, whose batches are tensors) the first batches' tensors repeated."""
    collate = getattr(loader, "collate_fn", None)
    if collate is None:
        batches = list(itertools.islice(loader, 4))
        return lambda size: tiled(batches, size)
    # The sampler's indices carry the training augmentation's seeds: samples as in the run.
    indices = itertools.islice(iter(loader.sampler), 4 * (loader.batch_size or 1))
    samples = [loader.dataset[index] for index in indices]
    return lambda size: collate([samples[i % len(samples)] for i in range(size)])


def tiled(batches: list[Any], size: int) -> Any:
    """A batch of `size` samples made of `batches` repeated (tensors in tuples, lists, dicts)."""
    first = batches[0]
    if isinstance(first, torch.Tensor):
        repeats = -(-size // sum(len(batch) for batch in batches))
        return torch.cat(batches * repeats)[:size]
    if isinstance(first, dict):
        return {key: tiled([batch[key] for batch in batches], size) for key in first}
    if isinstance(first, list | tuple):
        return type(first)(tiled([batch[i] for batch in batches], size) for i in range(len(first)))
    return first


@contextlib.contextmanager
def peak_memory(device: torch.device) -> Iterator[Callable[[], int]]:
    """Yields a function giving the peak memory in bytes of what ran inside the block: CUDA's
    allocator, or on the CPU the process's peak resident set (Linux: reset through
    /proc/self/clear_refs, read from VmHWM)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        yield lambda: torch.cuda.max_memory_allocated(device)
        return
    # What earlier, larger trials freed goes back to the system first (glibc keeps it), or it
    # would count in this one's peak.
    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc is not None and hasattr(ctypes.CDLL(libc), "malloc_trim"):
        ctypes.CDLL(libc).malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    yield (
        lambda: (
            1024
            * int(re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))
        )
    )

"""The engine's evaluation: a validation_step over every sample once, and the epoch's validation
of the trained and the averaged weights. BaseTrainer.evaluate and .validate call these; test.py
calls evaluate through its trainer."""

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from utils import unwrap_model
from utils.data.batches import to_device
from utils.distributed.process_group import broadcast_object, gather_objects, sync_buffers
from utils.distributed.sharding import is_sharded
from utils.evaluation.confusion import ConfusionMatrix
from utils.evaluation.metric_sums import MetricSums
from utils.evaluation.tta import AverageOverViews

if TYPE_CHECKING:
    from base.base_trainer import BaseTrainer


@torch.no_grad()
def evaluate(
    trainer: "BaseTrainer", loader: Any, prefix: str, observe: Any = None
) -> dict[str, float]:
    """validation_step over every sample of `loader` exactly once, summed over the ranks;
    `observe(result)` sees each step's StepOutput (test.py counts per-class hits). With
    test-time augmentation (trainer.tta_*), validation_step's model averages over views."""
    trainer.model.eval()
    sums = MetricSums(trainer.metric_fns, trainer.device)
    num_padding, spare = forward_padding(trainer.model, loader, trainer.rank)
    with averaged_over_views(trainer, trainer.model):
        for batch in loader:
            spare = batch = to_device(batch, trainer.device, trainer.options["channels_last"])
            result = run_validation_step(trainer, batch)
            sums.add(result)
            if observe is not None:
                observe(result)
        for _ in range(num_padding):  # as many forward passes as the other ranks; not counted
            batch = to_device(spare, trainer.device, trainer.options["channels_last"])
            run_validation_step(trainer, batch)
    metrics = sums.result(prefix)
    # Saved with the epoch's checkpoints: a cross-validation pools them over the folds.
    trainer.state.metric_sums = sums.stateful_sums
    return metrics


@contextlib.contextmanager
def averaged_over_views(trainer: "BaseTrainer", model: nn.Module) -> Iterator[None]:
    """Inside the block trainer.model is `model` averaged over the views trainer.tta_* name (what
    validation_step runs); without test-time augmentation, trainer.model as it was."""
    options, kept = trainer.options, trainer.model
    if not (options["tta_flip"] or options["tta_translate"]):
        yield
        return
    trainer.model = AverageOverViews(
        model,
        flip=options["tta_flip"],
        translate=options["tta_translate"],
        average=options["tta_average"],
        translate_weight=options["tta_translate_weight"],
    )
    try:
        yield
    finally:
        trainer.model = kept


def run_validation_step(trainer: "BaseTrainer", batch: Any) -> Any:
    """validation_step on a batch already on the device, inside autocast."""
    with torch.autocast(trainer.device.type, trainer.amp_dtype, trainer.amp_dtype is not None):
        return trainer.validation_step(batch)


def forward_padding(model: torch.nn.Module, loader: Any, rank: int) -> tuple[int, Any]:
    """Under FSDP each forward pass is a collective (every block's shards are gathered), so a
    rank with fewer batches than another (33 samples in batches of 8 on 2 ranks: 3 and 2) must
    run as many, or the other waits until distributed.timeout. Returns how many validation
    steps this rank adds, their results not counted, and for a rank with no batch of its own
    a batch to run them on (the first of the rank with the most); (0, None) without FSDP,
    whose forward passes need no other rank (DDP's neither)."""
    if not is_sharded(unwrap_model(model)):
        return 0, None
    counts = gather_objects(len(loader))  # one collective per evaluation, not one per batch
    most, spare = max(counts), None
    if min(counts) == 0 < most:
        donor = counts.index(most)
        first = next(iter(loader)) if rank == donor else None
        spare = broadcast_object(to_device(first, torch.device("cpu"), False), src=donor)
    return most - counts[rank], spare


def validate(trainer: "BaseTrainer") -> dict[str, float]:
    """The validation split through validation_step, and again with the averaged weights
    (val/ema_<metric>); for classifiers the confusion matrix is counted on the way."""
    if trainer.val_loader is None:
        return {}
    # Rank 0's BatchNorm statistics on every rank: the distributed validation then equals
    # test.py evaluating rank 0's checkpoint in one process.
    sync_buffers(unwrap_model(trainer.model))
    # Classifiers (data with class names) count their confusion matrix on the device.
    num_classes = len(trainer.data.class_names())
    trainer.confusion = (
        ConfusionMatrix(num_classes, trainer.device, trainer.data.ignore_index)
        if num_classes
        else None
    )
    observe = trainer.confusion.add if trainer.confusion is not None else None
    metrics = trainer.evaluate(trainer.val_loader, "val", observe)
    del metrics["val/num_samples"]  # the same every epoch: logged once at the start
    kept_sums = trainer.state.metric_sums
    if trainer.ema is not None:  # the averaged weights on the same data: val/ema_<metric>
        sync_buffers(trainer.ema.module)
        trained, trainer.model = trainer.model, trainer.ema.module  # what validation_step runs
        try:
            averaged = trainer.evaluate(trainer.val_loader, "val")
        finally:
            trainer.model = trained
        del averaged["val/num_samples"]
        metrics.update({key.replace("val/", "val/ema_"): value for key, value in averaged.items()})
        averaged_sums = trainer.state.metric_sums.items()
        kept_sums |= {key.replace("val/", "val/ema_"): sums for key, sums in averaged_sums}
        trainer.state.metric_sums = kept_sums
    return metrics

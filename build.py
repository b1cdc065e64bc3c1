"""Who wires the objects together: a run's data, model, loss, metrics, optimizer and trainer
from its config (train.py, test.py), and a checkpoint's model and input transform from the
checkpoint alone (predict.py, export.py: neither reads the data).

It sits beside the entry scripts because it looks names up in what users edit (model/,
data_loader/, trainer/); nothing below it imports it."""

import copy
import functools
import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import data_loader.data_loaders as data_module
import model.loss as loss_module
import model.metric as metric_module
import model.model as arch_module
import trainer as trainer_module
from base import BaseDataLoader, BaseModel, BaseTrainer
from data_loader.transforms import evaluation_transform
from model.torchvision_model import without_pretrained
from parse_config import ConfigError, ConfigParser
from utils.config.config_checks import metric_names
from utils.data.batches import global_batch
from utils.distributed.device import capabilities
from utils.distributed.process_group import (
    ProcessInfo,
    data_parallel,
    is_distributed,
    once_per_node,
)
from utils.distributed.sharding import check_fsdp_backend, checkpoint_activations, shard_model
from utils.optim.optimizer import NORM_LAYERS, build_optimizer
from utils.state.checkpoint import CheckpointError, load_checkpoint, use_averaged_weights
from utils.state.model_state import load_model_state
from utils.util import ConfigValueError, amp_dtype, get_rng_state, set_rng_state


def build_loss(config: ConfigParser, ignore_index: int | None = None) -> Callable:
    """config["loss"]: a function name in model/loss.py, or {"type": NAME, "args": {...}} for
    one with keyword arguments (e.g. cross_entropy's label_smoothing); the data's ignore_index
    as with_ignore_index says."""
    section = config["loss"]
    name, args = (section, {}) if isinstance(section, str) else (section["type"], section["args"])
    function = config.lookup(loss_module, name, "loss" if isinstance(section, str) else "loss.type")
    args = with_ignore_index(config, function, args, ignore_index, f"loss: {name}")
    try:  # called as function(output, target, **args)
        inspect.signature(function).bind(None, None, **args)
    except TypeError as error:
        raise ConfigError(f"{config.source}: loss.args: {error}") from None
    return functools.partial(function, **args) if args else function


def with_ignore_index(
    config: ConfigParser, target: Callable, args: dict, ignore_index: int | None, where: str
) -> dict:
    """args, plus the data's ignore_index (a target value that is no class, e.g. a mask's void
    255) for a loss or metric that takes `ignore_index` and whose args do not set it. One that
    does not take it is refused: it would score those targets as a class (or index past C)."""
    if ignore_index is None or "ignore_index" in args:
        return args
    if "ignore_index" not in inspect.signature(target).parameters:
        raise ConfigError(
            f"{config.source}: {where} cannot leave out the targets equal to "
            f"data_loader.args.ignore_index ({ignore_index}); name one that takes ignore_index "
            "(cross_entropy, nll_loss; PixelAccuracy, MeanIoU, F1) or give yours that argument"
        )
    return {**args, "ignore_index": ignore_index}


def build_metrics(
    config: ConfigParser, device: torch.device, data: BaseDataLoader
) -> dict[str, Any]:
    """config["metrics"]: each a name in model/metric.py, or {"type": NAME, "name": KEY, "args":
    {...}}. A function (a per-sample sum; args bound with functools.partial) or a class, built
    with its args: a StatefulMetric, or torchmetrics' Metric (moved to the device), keyed by its
    "name" (by default its type: val/<name>). A class that takes `class_names` and is not given
    them gets the data's (`class_names`, when the data has classes); the data's ignore_index as
    with_ignore_index says."""
    metrics, names, class_names = {}, metric_names(config["metrics"]), data.class_names()
    for index, entry in enumerate(config["metrics"]):
        name = names[index]
        type_name, args = (
            (entry, {}) if isinstance(entry, str) else (entry["type"], entry.get("args", {}))
        )
        where = f"metrics[{index}]"
        target = config.lookup(
            metric_module, type_name, where if isinstance(entry, str) else f"{where}.type"
        )
        takes_names = (
            inspect.isclass(target) and "class_names" in inspect.signature(target).parameters
        )
        if takes_names and class_names and "class_names" not in args:
            args = {**args, "class_names": class_names}
        args = with_ignore_index(config, target, args, data.ignore_index, f"{where}: {type_name}")
        try:
            inspect.signature(target).bind(
                *([] if inspect.isclass(target) else [None, None]), **args
            )
        except TypeError as error:
            raise ConfigError(f"{config.source}: {where}.args: {error}") from None
        if inspect.isclass(target):
            try:
                metric = target(**args)
            except ConfigValueError as error:
                raise ConfigError(f"{config.source}: {where}.args: {error}") from None
            metrics[name] = metric.to(device) if hasattr(metric, "to") else metric
        else:
            metrics[name] = functools.partial(target, **args) if args else target
    return metrics


def log_learning_rates(
    config: ConfigParser,
    optimizer: torch.optim.Optimizer,
    global_batch: int,
    logger: logging.Logger,
) -> None:
    """The learning rates the run starts from, with the batch they were scaled for."""
    rates = ", ".join(f"{group['lr']:.4g}" for group in optimizer.param_groups)
    reference = config["optimizer"]["reference_batch_size"]
    if reference is None:
        logger.info("Learning rate(s): %s (global batch %d).", rates, global_batch)
    else:
        logger.info(
            "Learning rate(s): %s: optimizer lr x global batch %d / reference_batch_size %d.",
            rates,
            global_batch,
            reference,
        )


def freeze(config: ConfigParser, model: torch.nn.Module) -> None:
    """Freeze the parameters arch.freeze names (see BaseModel.freeze), and with
    arch.freeze_norm_scale the scales of the normalisation layers."""
    if config["arch"]["freeze_norm_scale"]:
        for module in model.modules():
            if isinstance(module, NORM_LAYERS) and isinstance(module.weight, torch.nn.Parameter):
                module.weight.requires_grad_(False)
    prefixes = config["arch"].get("freeze") or []
    if not prefixes:
        return
    if not isinstance(model, BaseModel):
        raise ConfigError(f"{config.source}: arch.freeze: needs a model that subclasses BaseModel")
    try:
        model.freeze(prefixes)
    except ConfigValueError as error:
        raise ConfigError(f"{config.source}: {error}") from None


def build_trainer(
    config: ConfigParser,
    info: ProcessInfo,
    device: torch.device,
    logger: logging.Logger,
    *,
    training: bool = True,
    resumed: bool = False,
) -> BaseTrainer:
    """Data, model, loss, metrics, and (training) optimizer and schedule, handed to the
    trainer.type class with trainer.args. Without training (test.py): no optimizer. Resumed or
    not training, the model's weights come from a checkpoint: its pretrained ones go unread."""
    data = config.init_obj(
        "data_loader",
        data_module,
        seed=config["seed"],
        rank=info.rank,
        num_replicas=info.world_size,
        device=device,  # where pipeline "device" holds and augments the data
    )
    # Page-locked memory speeds up copies to CUDA only: the run's device decides, not whether
    # this machine has a GPU (device "cpu" on a GPU machine, MPS).
    data.pin_memory = data.pin_memory and capabilities(device).pin_memory
    # Downloads (and decoded-image caches) happen once per node, before any rank reads them. Only
    # some ranks and runs prepare, so what they draw must not move the model's initial weights.
    random_state = get_rng_state(device)
    once_per_node(data.prepare_data, info)
    set_rng_state(random_state, device)
    overrides = None if training and not resumed else without_pretrained(config["arch"])
    model = config.init_obj("arch", arch_module, overrides=overrides)
    if training and isinstance(model, BaseModel):  # what it takes from the training data
        model.fit_data(data)
    freeze(config, model)
    model = model.to(device)
    if info.world_size > 1 and config["distributed"]["sync_bn"]:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    options = config["trainer"]
    fsdp = is_distributed() and config["distributed"]["strategy"] == "fsdp"
    if options["channels_last"] and not fsdp:
        model = model.to(memory_format=torch.channels_last)  # NHWC: faster convolutions on GPUs
    # Under FSDP only the inputs are (to_device): fully_shard refuses non-contiguous parameters,
    # and gathers whole ones anyway; a convolution with a channels_last input runs in NHWC.
    if options["activation_checkpointing"]:
        count = checkpoint_activations(model)
        logger.info("Activation checkpointing: %d blocks recompute their activations.", count)
    if fsdp:  # before the optimizer: fully_shard replaces the parameters with their shards
        check_fsdp_backend(torch.distributed.get_backend())
        count = shard_model(
            model,
            amp_dtype=amp_dtype(options["amp"]),
            reshard_after_forward=config["distributed"]["reshard_after_forward"],
        )
        logger.info(
            "FSDP: %d blocks and the root sharded over %d process(es).", count, info.world_size
        )
    criterion = build_loss(config, data.ignore_index)
    metric_fns = build_metrics(config, device, data)
    optimizer = None
    if training:
        optimizer = build_optimizer(config, model, device, info.world_size)
        log_learning_rates(config, optimizer, global_batch(config, info.world_size), logger)
    if is_distributed() and not fsdp:
        model = data_parallel(model, None if device.index is None else [device.index])
    if options["compile"]:
        # Compiled lazily at the first batch; checkpoints still hold the plain model's state.
        model = torch.compile(model, mode=options["compile_mode"])
    return config.init_obj(
        "trainer", trainer_module, model, criterion, metric_fns, optimizer,
        config=config, device=device, data=data, logger=logger, rank=info.rank,
    )  # fmt: skip


def load_inference_model(
    path: Path, *, weights: str = "auto"
) -> tuple[torch.nn.Module, ConfigParser, dict]:
    """(model in evaluation mode on the CPU, its config, the checkpoint) of checkpoint `path`,
    holding the weights --weights chose (use_averaged_weights); state["ema_chosen"] says which."""
    state = load_checkpoint(path, map_location="cpu")
    if not isinstance(state["config"], dict):
        raise CheckpointError(
            f"{path}: its config is not a dict; not a checkpoint of this template"
        )
    config = copy.deepcopy(state["config"])
    parsed = ConfigParser(config, source=f"{path} (its config)")
    # The pretrained weights the run started from: the checkpoint's replace them, unread.
    model = parsed.init_obj("arch", arch_module, overrides=without_pretrained(parsed["arch"]))
    state["ema_chosen"] = use_averaged_weights(state, weights)
    load_model_state(model, state, path, ema=state["ema_chosen"])
    return model.eval(), parsed, state


def weights_note(state: dict) -> str:
    """Which weights were loaded, and why, for the log."""
    if not state["ema_chosen"]:
        return "the trained weights"
    monitor = (state.get("config") or {}).get("trainer", {}).get("monitor", "")
    why = f" (trainer.monitor {monitor!r} judged them)" if state.get("weights") == "ema" else ""
    return f"the averaged weights{why}"


def example_inputs(config: ConfigParser, model: torch.nn.Module, batch_size: int) -> torch.Tensor:
    """A batch of inputs like the model's, from the checkpoint alone: random images (B, C, H, W)
    through the run's evaluation transform, or for other data what its loader's classmethod
    example_inputs(args, model, batch_size) makes (e.g. random rows, (B, in_features))."""
    section = config["data_loader"]
    loader_class = config.lookup(data_module, section["type"], "data_loader.type")
    if hasattr(loader_class, "example_inputs"):
        return loader_class.example_inputs(section["args"], model, batch_size)
    transform = input_transform(config)
    pixels = np.random.default_rng(0).integers(0, 256, (batch_size, 64, 64, 3), np.uint8)
    return torch.stack([transform(image) for image in pixels])  # (B, C, H, W) float32


def export_signature(config: ConfigParser) -> tuple[str, str, dict[int, str]]:
    """(the exported file's input name, its output name, the input dims besides the batch that
    may vary: {dim: name}) that the run's data loader class declares (input_names,
    output_names, dynamic_dims; BaseDataLoader's defaults: "images", "logits", none)."""
    section = config["data_loader"]
    loader_class = config.lookup(data_module, section["type"], "data_loader.type")
    names = {"input_names": loader_class.input_names, "output_names": loader_class.output_names}
    for attribute, value in names.items():
        if not (isinstance(value, tuple) and len(value) == 1 and str(value[0]).isidentifier()):
            raise ConfigValueError(
                f"{loader_class.__name__}.{attribute}: must be one name (a tuple of one "
                f"identifier: the models here take one input and return one output), got {value!r}"
            )
    dims = dict(loader_class.dynamic_dims)
    if not all(
        type(dim) is int and dim > 0 and str(name).isidentifier() for dim, name in dims.items()
    ):
        raise ConfigValueError(
            f"{loader_class.__name__}.dynamic_dims: must map input dims > 0 (0 is the batch) to "
            f'names, e.g. {{1: "length"}}, got {dims!r}'
        )
    return names["input_names"][0], names["output_names"][0], dims


def input_transform(config: ConfigParser) -> Callable:
    """Image (PIL or HWC uint8 array) -> the model's input (C, H, W), as the run evaluated it."""
    section = config["data_loader"]
    loader_class = config.lookup(data_module, section["type"], "data_loader.type")
    try:
        return evaluation_transform(loader_class, section["args"])
    except ConfigValueError as error:
        raise ConfigError(f"{config.source}: data_loader: {error}") from None

"""A run's objects, built from its config in one place for train.py and test.py."""

import functools
import inspect
import logging
from collections.abc import Callable

import torch
from torch.nn.parallel import DistributedDataParallel

import data_loader.data_loaders as data_module
import model.loss as loss_module
import model.metric as metric_module
import model.model as arch_module
import trainer as trainer_module
from base import BaseTrainer
from parse_config import ConfigError, ConfigParser
from utils.batches import global_batch
from utils.device import capabilities
from utils.distributed import ProcessInfo, is_distributed, once_per_node
from utils.optim import build_optimizer, freeze


def build_loss(config: ConfigParser) -> Callable:
    """config["loss"]: a function name in model/loss.py, or {"type": NAME, "args": {...}} for
    one with keyword arguments (e.g. cross_entropy's label_smoothing)."""
    section = config["loss"]
    if isinstance(section, str):
        return config.lookup(loss_module, section, "loss")
    function = config.lookup(loss_module, section["type"], "loss.type")
    args = section["args"]
    try:  # called as function(output, target, **args)
        inspect.signature(function).bind(None, None, **args)
    except TypeError as error:
        raise ConfigError(f"{config.source}: loss.args: {error}") from None
    return functools.partial(function, **args)


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


def build_trainer(
    config: ConfigParser,
    info: ProcessInfo,
    device: torch.device,
    logger: logging.Logger,
    *,
    training: bool = True,
) -> BaseTrainer:
    """Data, model, loss, metrics, and (training) optimizer and schedule, handed to the
    trainer.type class with trainer.args. Without training (test.py): no optimizer."""
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
    # Downloads (and decoded-image caches) happen once per node, before any rank reads them.
    once_per_node(data.prepare_data, info)
    model = config.init_obj("arch", arch_module)
    freeze(config, model)
    model = model.to(device)
    if info.world_size > 1 and config["distributed"]["sync_bn"]:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    criterion = build_loss(config)
    metric_fns = {
        name: config.lookup(metric_module, name, f"metrics[{index}]")
        for index, name in enumerate(config["metrics"])
    }
    optimizer = None
    if training:
        optimizer = build_optimizer(config, model, device, info.world_size)
        log_learning_rates(config, optimizer, global_batch(config, info.world_size), logger)
    options = config["trainer"]
    if options["channels_last"]:
        model = model.to(memory_format=torch.channels_last)  # NHWC: faster convolutions on GPUs
    if is_distributed():
        # No buffer broadcast before every forward: rank 0's BatchNorm statistics come from its
        # own batches either way, and validation copies them to every rank (sync_buffers).
        device_ids = None if device.index is None else [device.index]
        model = DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)
    if options["compile"]:
        # Compiled lazily at the first batch; checkpoints still hold the plain model's state.
        model = torch.compile(model, mode=options["compile_mode"])
    return config.init_obj(
        "trainer", trainer_module, model, criterion, metric_fns, optimizer,
        config=config, device=device, data=data, logger=logger, rank=info.rank,
    )  # fmt: skip

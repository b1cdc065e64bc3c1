"""A run's objects, built from its config in one place for train.py and test.py."""

import logging

import torch
from torch.nn.parallel import DistributedDataParallel

import data_loader.data_loaders as data_module
import model.loss as loss_module
import model.metric as metric_module
import model.model as arch_module
import trainer as trainer_module
from base import BaseTrainer
from parse_config import ConfigParser
from utils.distributed import ProcessInfo, is_distributed, once_per_node
from utils.optim import build_optimizer, freeze


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
    )
    # Downloads happen once per node, before any rank reads the files.
    once_per_node(data.prepare_data, info)
    model = config.init_obj("arch", arch_module)
    freeze(config, model)
    model = model.to(device)
    if info.world_size > 1 and config["distributed"]["sync_bn"]:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    criterion = config.lookup(loss_module, config["loss"], "loss")
    metric_fns = {
        name: config.lookup(metric_module, name, f"metrics[{index}]")
        for index, name in enumerate(config["metrics"])
    }
    optimizer = build_optimizer(config, model, device) if training else None
    lr_scheduler = None
    if training and config["lr_scheduler"] is not None:
        lr_scheduler = config.init_obj("lr_scheduler", torch.optim.lr_scheduler, optimizer)
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
        config=config, device=device, data=data, lr_scheduler=lr_scheduler, logger=logger,
        rank=info.rank,
    )  # fmt: skip

"""FSDP2 (distributed.strategy "fsdp"): each block's parameters, gradients and optimizer state
sharded across the ranks, then the root's; and activation checkpointing per block, with any
strategy. The blocks are BaseModel.blocks() (default_blocks for other models)."""

import contextlib
import re
from contextlib import AbstractContextManager

import torch
from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from utils.util import UserError

# On CPU with gloo, FSDP2's reduce_scatter averaged wrongly before torch 2.9 (gloo treats AVG as
# SUM: gradients world-size times too large, pytorch/pytorch#162338), and on torch 2.6 it does not
# run at all (torch.cpu.Stream has no record_event).
GLOO_FSDP_MIN_TORCH = (2, 9)
BLOCK_LISTS = ("layers", "blocks", "features")  # a container whose children are the blocks
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def torch_version() -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", torch.__version__).groups()
    return int(major), int(minor)


def check_fsdp_backend(backend: str) -> None:
    """Refuse FSDP where torch computes it wrongly: gloo before torch 2.9."""
    if backend == "gloo" and torch_version() < GLOO_FSDP_MIN_TORCH:
        raise UserError(
            f'distributed.strategy "fsdp" on gloo (the CPU) needs torch >= 2.9, this is '
            f"{torch.__version__}: before it FSDP's gradients are wrong on gloo "
            '(pytorch/pytorch#162338); use NCCL on GPUs, or strategy "ddp"'
        )


def default_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of common architectures, in order: torchvision ResNets' layer1..
    layerN, the children of a ModuleList or Sequential named layers, blocks or features (ViT's
    encoder.layers, timm's blocks, this template's CifarCNN and FastCifarCNN) that hold
    parameters and are themselves containers. [] when none is found: the root alone."""
    modules = dict(model.named_modules())
    stages = [module for name, module in modules.items() if re.fullmatch(r"(.+\.)?layer\d+", name)]
    if stages:
        return stages
    for name, module in modules.items():
        if name.rpartition(".")[2] in BLOCK_LISTS and isinstance(
            module, nn.ModuleList | nn.Sequential
        ):
            blocks = [
                child
                for child in module.children()
                if any(True for _ in child.children()) and any(True for _ in child.parameters())
            ]
            if blocks:
                return blocks
    return []


def model_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's blocks: its blocks() hook (BaseModel), else default_blocks."""
    hook = getattr(model, "blocks", None)
    return list(hook()) if callable(hook) else default_blocks(model)


def checkpoint_activations(model: nn.Module) -> int:
    """Recompute each block's activations in the backward pass instead of keeping them (less
    memory, about a third more compute); the parameter names stay the same. Returns the count."""
    blocks = model_blocks(model)
    if not blocks:
        raise UserError(
            f"trainer.activation_checkpointing: {type(model).__name__} has no blocks to "
            "recompute (define its blocks() method, see docs/distributed.md)"
        )
    for block in blocks:
        checkpoint(block)
    return len(blocks)


def shard_model(
    model: nn.Module, *, amp_dtype: torch.dtype | None, reshard_after_forward: bool
) -> int:
    """fully_shard each block, then the root, on the default process group. With trainer.amp
    bf16, the parameters compute in bf16 (but BatchNorm's) and gradients reduce in fp32
    (MixedPrecisionPolicy); the engine's autocast casts between them.
    Returns the number of blocks."""
    policy = MixedPrecisionPolicy(param_dtype=amp_dtype, reduce_dtype=torch.float32)
    if amp_dtype is not None:
        # BatchNorm keeps fp32 parameters (its running statistics are fp32 and batch_norm wants
        # one dtype): a unit of its own, its input cast to fp32; autocast casts it back after.
        for module in model.modules():
            if isinstance(module, BATCH_NORMS):
                fully_shard(module, reshard_after_forward=reshard_after_forward,
                            mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32))  # fmt: skip
    blocks = model_blocks(model)
    for block in blocks:
        fully_shard(block, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    # The root's parameters are gathered for the backward pass anyway: no reshard after forward.
    fully_shard(model, reshard_after_forward=False, mp_policy=policy)
    return len(blocks)


def is_sharded(model: nn.Module) -> bool:
    """Whether fully_shard wrapped `model` (its parameters are DTensors)."""
    return isinstance(model, FSDPModule)


def model_class(model: nn.Module) -> type:
    """The class the config named: fully_shard swaps in a subclass of it and FSDPModule."""
    return next(cls for cls in type(model).__mro__ if not issubclass(cls, FSDPModule))


def gradient_sync(model: nn.Module, sync: bool) -> AbstractContextManager:
    """Around a batch's forward and backward: reduce the gradients across ranks only when
    `sync` (the last batch of an accumulation group). DDP's no_sync(), FSDP's
    set_requires_gradient_sync; nothing to do in a single process."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    no_sync = getattr(model, "no_sync", None)
    return contextlib.nullcontext() if sync or no_sync is None else no_sync()

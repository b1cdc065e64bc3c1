"""torch.distributed helpers: no-ops in a single process, collectives under torchrun."""

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class ProcessInfo:
    """Where this process stands: 0, 0, 1 without torchrun."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_distributed(backend: str | None) -> ProcessInfo:
    """Join the process group torchrun set up (RANK, LOCAL_RANK, WORLD_SIZE in the environment).

    backend None: nccl when CUDA is available, else gloo. Each rank uses cuda:LOCAL_RANK.
    """
    if not launched_by_torchrun():
        return ProcessInfo()
    info = ProcessInfo(
        rank=int(os.environ["RANK"]),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        world_size=int(os.environ["WORLD_SIZE"]),
    )
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(info.local_rank)
    # Namespace the process group's keys by restart: torchrun reuses its key-value store across
    # elastic restarts, and without a prefix the relaunched workers read the dead workers'
    # addresses (gloo then fails with "Connection refused").
    store, _, _ = next(dist.rendezvous("env://"))
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"template/restart{restart}", store)
    dist.init_process_group(backend, store=store, rank=info.rank, world_size=info.world_size)
    return info


def close_distributed() -> None:
    if is_distributed():
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over all ranks in place (and return it); unchanged in a single process."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum over all ranks, in place; unchanged in a single process."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def broadcast_object(value: object) -> object:
    """Rank 0's `value` on every rank."""
    if not is_distributed():
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def sync_buffers(module: nn.Module) -> None:
    """Copy rank 0's buffers (BatchNorm running statistics) to every rank.

    After the last training step each rank holds the statistics of its own last batch;
    evaluating with rank 0's on every rank makes the distributed validation equal to a
    single process evaluating rank 0's checkpoint.
    """
    if is_distributed():
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)

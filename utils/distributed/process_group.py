"""torch.distributed helpers: no-ops in a single process, collectives under torchrun."""

import contextlib
import gc
import inspect
import logging
import os
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from utils.util import TrainingError, UserError

# How long the other processes wait for one node's preparation (a download, a decoded-image
# cache): on a CPU group of its own, which no NCCL watchdog aborts.
PREPARE_TIMEOUT = timedelta(hours=24)

Result = TypeVar("Result")


@dataclass(frozen=True)
class ProcessInfo:
    """Where this process stands: 0, 0, 1 without torchrun."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    torchrun: bool = False  # launched by torchrun: it joins a process group, even of one

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def process_info() -> ProcessInfo:
    """This process's place under torchrun (RANK, LOCAL_RANK, WORLD_SIZE), else 0, 0, 1."""
    if not launched_by_torchrun():
        return ProcessInfo()
    return ProcessInfo(
        rank=int(os.environ["RANK"]),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        world_size=int(os.environ["WORLD_SIZE"]),
        torchrun=True,
    )


def one_process(script: str, writes: str) -> None:
    """Refuse torchrun with more than one process for a script that works in one (predict.py,
    export.py): every rank would do all of the work and `writes`, at once, to the same place."""
    if launched_by_torchrun() and int(os.environ["WORLD_SIZE"]) > 1:
        raise UserError(
            f"{script} runs in one process: start it with python, not torchrun (its "
            f"{os.environ['WORLD_SIZE']} processes would each {writes})"
        )


def default_backend(device: torch.device) -> str:
    """nccl for a model on a CUDA device, gloo otherwise: the collectives run on the model's
    tensors, and nccl cannot reduce CPU tensors (n_gpu 0 on a GPU machine)."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_distributed(
    info: ProcessInfo,
    backend: str | None,
    device: torch.device,
    timeout_minutes: float | None = None,
) -> None:
    """Join the process group torchrun set up; nothing without torchrun.

    backend None: default_backend(device). A CUDA device becomes this process's current one.
    timeout_minutes: how long a collective may wait before it fails (distributed.timeout;
    None: torch's default, 10 minutes for NCCL, 30 for gloo).
    """
    if not launched_by_torchrun():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # Namespace the process group's keys by restart: torchrun reuses its key-value store across
    # elastic restarts, and without a prefix the relaunched workers read the dead workers'
    # addresses (gloo then fails with "Connection refused").
    store, _, _ = next(dist.rendezvous("env://"))
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"template/restart{restart}", store)
    timeout = None if timeout_minutes is None else timedelta(minutes=timeout_minutes)
    dist.init_process_group(
        backend or default_backend(device),
        store=store,
        rank=info.rank,
        world_size=info.world_size,
        timeout=timeout,
    )


@contextlib.contextmanager
def process_group(
    info: ProcessInfo,
    backend: str | None,
    device: torch.device,
    timeout_minutes: float | None = None,
) -> Iterator[None]:
    """Inside: a member of torchrun's process group (init_distributed), left on the way out,
    also when an exception ends the run."""
    init_distributed(info, backend, device, timeout_minutes)
    try:
        yield
    except BaseException as error:
        close_distributed(error)
        raise
    close_distributed()


def close_distributed(error: BaseException | None = None) -> None:
    """Leave the process group. `error`: the exception ending the run; its traceback's frames
    hold the trainer, whose DDP model holds the group, so they are let go first."""
    if not is_distributed():
        return
    # Before torch 2.8, the last reference to a gloo group destroys its backend while holding the
    # GIL, and the backend waits for its worker threads, which may need the GIL to free a
    # finished collective's tensor: a deadlock at exit (pytorch/pytorch#154976). So hold the
    # backend, let everything else that refers to the group go (DDP in the frames of an error,
    # reference cycles), destroy the group, and drop the backend last: its own binding releases
    # the GIL before destroying it.
    try:
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    except RuntimeError:  # no CPU backend: NCCL alone
        backend = None
    seen: set[int] = set()
    while error is not None and id(error) not in seen:  # the error and those it chains
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)  # their locals; not the lines it prints
        error = error.__cause__ or error.__context__
    gc.collect()
    dist.destroy_process_group()
    del backend


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def data_parallel(model: nn.Module, device_ids: list[int] | None) -> DistributedDataParallel:
    """`model` under DDP without a buffer broadcast before every forward: rank 0's BatchNorm
    statistics come from its own batches either way, and validation copies them to every rank
    (sync_buffers). torch 2.13 renamed that switch (broadcast_buffers, now deprecated with a
    warning on every rank, became forward_sync_buffers)."""
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters:
        return DistributedDataParallel(model, device_ids=device_ids, forward_sync_buffers=False)
    return DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)


def world_size() -> int:
    """The number of processes training together (1 without torchrun)."""
    return dist.get_world_size() if is_distributed() else 1


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


def gather_objects(value: object) -> list:
    """Every rank's `value`, in rank order, on every rank ([value] in a single process)."""
    if not is_distributed():
        return [value]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def once_per_node(function: Callable[[], None], info: ProcessInfo) -> None:
    """Call `function` (e.g. a download) once per machine while the other processes wait.

    Rank 0 goes first, then the first process of every other node: where the nodes share a
    file system the files are then already there, where they do not each node fetches its own.
    The others wait in a gloo group of its own with a long timeout (PREPARE_TIMEOUT): not in a
    collective of the training group, whose timeout (distributed.timeout, and NCCL's watchdog)
    would end the run while a large folder is still being prepared. A UserError on any rank is
    raised on every rank, so none is left waiting.
    """
    if not is_distributed():
        function()
        return
    group = dist.new_group(backend="gloo", timeout=PREPARE_TIMEOUT)
    try:
        first = info.is_main
        other_node = info.local_rank == 0 and not info.is_main
        for my_turn in (first, other_node):
            error = None
            if my_turn:
                try:
                    function()
                except UserError as raised:
                    error = str(raised)
            # Also the barrier: nobody goes on before this turn is over.
            gathered: list = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, error, group=group)
            errors = [message for message in gathered if message]
            if errors:
                raise UserError(errors[0])
    finally:
        # As close_distributed does, for the torch < 2.8 deadlock (pytorch/pytorch#154976): the
        # backend is held past the group and dropped last, by its own binding, which releases
        # the GIL while it waits for its worker threads.
        backend = group._get_backend(torch.device("cpu"))
        dist.destroy_process_group(group)
        del group
        del backend


def on_rank0(function: Callable[..., Result], *args: object) -> Result:
    """function(*args) on rank 0 alone, its result on every rank: the others must not race its
    writes. A UserError or TrainingError (e.g. a SaveError) it raises is raised on every rank,
    with its class and message, so that none is left waiting."""
    result, error = None, None
    if not is_distributed() or dist.get_rank() == 0:
        try:
            result = function(*args)
        except (UserError, TrainingError) as raised:
            if not is_distributed():
                raise
            error = (type(raised), str(raised))
    result, error = broadcast_object((result, error))
    if error:
        kind, message = error
        raise kind(message)
    return result


def broadcast_object(value: object, src: int = 0) -> object:
    """Rank `src`'s `value` on every rank."""
    if not is_distributed():
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=src)
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


@contextlib.contextmanager
def said_by_rank0(
    loggers: logging.Logger | tuple[logging.Logger, ...], rank: int, verbosity: int
) -> Iterator[None]:
    """Inside, `loggers` keep quiet on ranks other than 0 but for errors: for work every rank
    does alike (building from one config, reading one data folder, restoring one checkpoint),
    whose warnings would otherwise be printed once per rank. verbosity 2 (every rank logs
    everything, for debugging) leaves them as they are."""
    if rank == 0 or verbosity >= 2:
        yield
        return
    loggers = loggers if isinstance(loggers, tuple) else (loggers,)
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)

"""Per-rank memory of FSDP (the template's shard_model) against DDP, and their step times, on CPU.

What is measured: a torchvision model (--model, 1000 classes, no pretrained weights) trained on 2
processes (gloo on 127.0.0.1, OMP_NUM_THREADS=1), first wrapped in DistributedDataParallel (each
rank holds everything), then, rebuilt from the same seed, sharded with
utils.distributed.sharding.shard_model (each block, then the root; fp32, reshard after forward).
Each takes a warm-up step and --steps timed steps of forward + backward + AdamW step on a random
batch (--batch-size images of 224x224 per rank, cross-entropy); after the last step, every rank
counts the bytes it holds in parameters, gradients and AdamW state (exp_avg, exp_avg_sq, step):
a DTensor's local shard (`.to_local()`), a plain tensor as it is. Not counted: buffers (BatchNorm
statistics), activations, DDP's gradient buckets, FSDP's all-gather buffers. Printed: the largest
rank's bytes per kind for DDP and FSDP with their ratio (goal: total FSDP / DDP <= 0.55; 0.5 is
perfect sharding on 2 ranks) and the mean step time FSDP / DDP (noisy on a shared machine).

python benchmarks/fsdp_memory.py [--model resnet50] [--steps 3] [--batch-size 2]

Run without torchrun's variables, it starts itself under torchrun with 2 processes.
"""

import argparse
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as `python benchmarks/fsdp_memory.py`: import the project

from model.model import TorchvisionModel  # noqa: E402
from utils.distributed.process_group import (  # noqa: E402
    data_parallel,
    process_group,
    process_info,
)
from utils.distributed.sharding import check_fsdp_backend, shard_model  # noqa: E402

NUM_PROCESSES = 2
NUM_CLASSES = 1000
KINDS = ("parameters", "gradients", "optimizer state")
STRATEGIES = ("DDP", "FSDP")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50", help="torchvision model (default resnet50)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after 1 warm-up")
    parser.add_argument("--batch-size", type=int, default=2, help="images per rank (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, drawn below Linux's ephemeral range (so
    the kernel does not hand it to someone else before torchrun binds it)."""
    draw = random.SystemRandom()
    for _ in range(100):
        port = draw.randrange(20000, 32000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000 on 127.0.0.1")


def launch_workers() -> int:
    """Run this script again under torchrun with NUM_PROCESSES processes; their exit status."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
        f"--nproc_per_node={NUM_PROCESSES}", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        str(Path(__file__).resolve()), *sys.argv[1:],
    ]  # fmt: skip
    # One thread per process on a 2-core machine; gloo on the loopback interface, not the
    # address the host name resolves to.
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    return subprocess.run(command, cwd=ROOT, env=env).returncode


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes this rank holds for `tensor`: its own shard of a DTensor."""
    if isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    return tensor.numel() * tensor.element_size()


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state on this rank."""
    parameters = list(model.parameters())
    state_tensors = [
        value
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    ]
    return {
        "parameters": sum(local_bytes(parameter) for parameter in parameters),
        "gradients": sum(
            local_bytes(parameter.grad) for parameter in parameters if parameter.grad is not None
        ),
        "optimizer state": sum(local_bytes(tensor) for tensor in state_tensors),
    }


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    images: torch.Tensor,
    labels: torch.Tensor,
) -> None:
    # Zeroed before the step, not after it: the gradients are still there to be counted.
    optimizer.zero_grad(set_to_none=True)
    logits = model(images)  # (B, num_classes)
    nn.functional.cross_entropy(logits, labels).backward()
    optimizer.step()


def measure(
    strategy: str,
    args: argparse.Namespace,
    images: torch.Tensor,
    labels: torch.Tensor,
) -> tuple[dict[str, int], float]:
    """(bytes held per kind, mean seconds per timed step) of one strategy on this rank."""
    torch.manual_seed(args.seed)  # the same initial weights for both strategies
    model: nn.Module = TorchvisionModel(args.model, num_classes=NUM_CLASSES)
    if strategy == "FSDP":
        shard_model(model, amp_dtype=None, reshard_after_forward=True)
    else:
        model = data_parallel(model, None)  # as build.py wraps it
    # After fully_shard: it replaces the parameters with their shards.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    train_step(model, optimizer, images, labels)  # warm-up: creates AdamW's state, lazy init
    dist.barrier()  # both ranks start timing together
    start = time.perf_counter()
    for _ in range(args.steps):
        train_step(model, optimizer, images, labels)
    dist.barrier()  # until the slower rank is done
    seconds = (time.perf_counter() - start) / args.steps
    return held_bytes(model, optimizer), seconds


def print_report(args: argparse.Namespace, results: list[dict[str, tuple]]) -> None:
    """The table of the largest rank's bytes and the step-time ratio; `results[rank][strategy]`
    is (bytes per kind, seconds per step)."""
    largest = {
        strategy: {
            kind: max(result[strategy][0][kind] for result in results) for kind in (*KINDS, "total")
        }
        for strategy in STRATEGIES
    }
    print(
        f"{args.model}, {NUM_PROCESSES} processes (gloo, 1 thread each), batch {args.batch_size} "
        f"of 224x224 per rank, AdamW; bytes held by the largest rank after step {args.steps + 1}"
    )
    print(f"{'':<16}  {'DDP (MB)':>10}  {'FSDP (MB)':>10}  {'FSDP / DDP':>10}")
    for kind in (*KINDS, "total"):
        ddp, fsdp = largest["DDP"][kind], largest["FSDP"][kind]
        print(f"{kind:<16}  {ddp / 1e6:>10.1f}  {fsdp / 1e6:>10.1f}  {fsdp / ddp:>10.3f}")
    per_rank = ", ".join(
        f"rank {rank} {result['FSDP'][0]['total'] / 1e6:.1f}" for rank, result in enumerate(results)
    )
    print(f"FSDP total per rank (MB): {per_rank}")
    ddp_seconds = max(result["DDP"][1] for result in results)
    fsdp_seconds = max(result["FSDP"][1] for result in results)
    print(
        f"step time (mean of {args.steps} after 1 warm-up): DDP {ddp_seconds:.3f} s, "
        f"FSDP {fsdp_seconds:.3f} s, FSDP / DDP {fsdp_seconds / ddp_seconds:.3f}"
    )
    total_ratio = largest["FSDP"]["total"] / largest["DDP"]["total"]
    verdict = "met" if total_ratio <= 0.55 else "not met"
    print(f"goal: total FSDP / DDP <= 0.55 ({total_ratio:.3f}, {verdict})")


def worker(args: argparse.Namespace) -> None:
    """One rank: measure DDP, then FSDP; rank 0 gathers both ranks' results and prints them."""
    check_fsdp_backend("gloo")
    torch.set_num_threads(1)
    # Left as train.py leaves it: the models measure() built, reference cycles that hold the
    # group, are collected before the group is destroyed (see tests/fsdp_gradients.py).
    with process_group(process_info(), "gloo", torch.device("cpu")):
        rank = dist.get_rank()
        generator = torch.Generator().manual_seed(args.seed + rank)  # each rank its own batch
        images = torch.randn(args.batch_size, 3, 224, 224, generator=generator)  # (B, C, H, W)
        labels = torch.randint(0, NUM_CLASSES, (args.batch_size,), generator=generator)  # (B,)
        result = {}
        for strategy in STRATEGIES:
            held, seconds = measure(strategy, args, images, labels)
            result[strategy] = ({**held, "total": sum(held.values())}, seconds)
        results = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(result, results, dst=0)
        if rank == 0:
            print_report(args, results)


def main() -> None:
    args = parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # a torchrun worker
        worker(args)
    else:
        raise SystemExit(launch_workers())


if __name__ == "__main__":
    main()

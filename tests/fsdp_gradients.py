"""Under torchrun: one FSDP step of CifarCNN on this rank's half of a fixed global batch, with
the template's sharding and gradient clipping; rank 0 saves the whole gradients, the clipped
gradients' norm, the weights after an SGD step and the gradients with bf16 parameters to the
file argv[1] (tests/test_fsdp.py compares them with one process on the whole batch)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
from torch import nn

from model.model import CifarCNN
from utils.distributed.process_group import process_group, process_info
from utils.distributed.sharding import shard_model

GLOBAL_BATCH = 8


def fixed_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(GLOBAL_BATCH, 3, 16, 16, generator=generator)
    return images, torch.randint(0, 10, (GLOBAL_BATCH,), generator=generator)


def new_model() -> CifarCNN:
    """In evaluation mode: BatchNorm normalises with its running statistics, so that a sample's
    gradient does not depend on the other samples on its rank (in training mode each rank
    normalises by its own share of the batch, with DDP as with FSDP)."""
    torch.manual_seed(0)
    return CifarCNN(in_shape=[3, 16, 16], widths=[8, 16], convs_per_block=1).eval()


def sharded_step() -> dict[str, object]:
    """What rank 0 saves: whole tensors only, so that no sharded model outlives this call."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = new_model()
    shard_model(model, amp_dtype=None, reshard_after_forward=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    images, labels = fixed_batch()
    mine = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    nn.functional.cross_entropy(model(images[mine]), labels[mine]).backward()
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    norm = nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    optimizer.step()
    # Detached: a parameter's full_tensor() is differentiable, and its graph holds the device
    # mesh, so the process group, past the group's end (see main).
    weights = {name: p.detach().full_tensor() for name, p in model.named_parameters()}

    # trainer.amp "bf16": the layers compute with bf16 parameters, gradients reduce in fp32.
    mixed = new_model()
    shard_model(mixed, amp_dtype=torch.bfloat16, reshard_after_forward=True)
    seen = []
    mixed.head.register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
    with torch.autocast("cpu", torch.bfloat16):  # as the engine runs a step with trainer.amp
        loss = nn.functional.cross_entropy(mixed(images[mine]), labels[mine])
    loss.backward()
    mixed_grads = {name: p.grad.full_tensor() for name, p in mixed.named_parameters()}
    return {"grads": grads, "norm": norm, "weights": weights, "bf16_grads": mixed_grads,
            "bf16_forward": str(seen[0])}  # fmt: skip


def main() -> None:
    # Left as train.py leaves it: the sharded models, reference cycles that hold the group, are
    # collected before the group is destroyed. Destroyed while they lived, the group went with
    # them whenever the collector next ran, at worst during the interpreter's exit, where the
    # gloo backend's worker threads cannot take the GIL: 1 run in 140 aborted ("terminate called
    # without an active exception"). The same abort, 1 run in about 20 in CI, came from the
    # saved weights' autograd graph, which held the mesh: they are detached now.
    with process_group(process_info(), "gloo", torch.device("cpu")):
        result = sharded_step()
        if dist.get_rank() == 0:
            torch.save(result, sys.argv[1])
        del result


if __name__ == "__main__":
    main()

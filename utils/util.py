"""Errors, seeding, RNG state and device selection."""

import logging
import os
import random

import numpy as np
import torch


class UserError(Exception):
    """A mistake in the user's input (config, CLI, files): reported in one line, exit code 2."""


def describe_error(error: BaseException) -> str:
    """'TypeName: first line of the message', for one-line error reports."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def derive_seed(*parts: int) -> int:
    """Mix integers (seed, epoch, rank, ...) into one well-spread 63-bit seed."""
    # SeedSequence hashes the whole tuple, so (1, 2) and (2, 1) give unrelated streams.
    return int(np.random.SeedSequence(list(parts)).generate_state(2, np.uint64)[0] >> 1)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def get_rng_state() -> dict:
    """Every global RNG state as tensors and built-in types, so weights_only loading reads it."""
    version, python_state, gauss = random.getstate()
    _, numpy_keys, numpy_pos, numpy_has_gauss, numpy_gauss = np.random.get_state()
    return {
        "python": [version, list(python_state), gauss],
        "numpy": [
            torch.from_numpy(numpy_keys.astype(np.int64)),
            numpy_pos,
            numpy_has_gauss,
            numpy_gauss,
        ],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    """Restore what get_rng_state returned."""
    version, python_state, gauss = state["python"]
    random.setstate((version, tuple(python_state), gauss))
    numpy_keys, numpy_pos, numpy_has_gauss, numpy_gauss = state["numpy"]
    np.random.set_state(
        ("MT19937", numpy_keys.numpy().astype(np.uint32), numpy_pos, numpy_has_gauss, numpy_gauss)
    )
    torch.set_rng_state(state["torch"])
    # A checkpoint from a machine with more GPUs restores the devices this one has.
    if torch.cuda.is_available() and state["cuda"]:
        num_devices = min(len(state["cuda"]), torch.cuda.device_count())
        for index in range(num_devices):
            torch.cuda.set_rng_state(state["cuda"][index], index)


def configure_torch(trainer_config: dict) -> None:
    """Apply trainer.deterministic, cudnn_benchmark and tf32 to torch's global settings."""
    if trainer_config["deterministic"]:
        # Bit-exact reruns: refuse non-deterministic kernels (cuBLAS needs this workspace setting).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    # Speed knobs for CUDA (no effect on the CPU): cuDNN picks the fastest kernels by timing
    # them; TF32 runs fp32 matrix products on tensor cores with a 10-bit mantissa.
    torch.backends.cudnn.benchmark = trainer_config["cudnn_benchmark"]
    if trainer_config["tf32"]:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"


def amp_dtype(amp: str | None) -> torch.dtype | None:
    """trainer.amp ("bf16", "fp16" or None) as the dtype torch.autocast takes."""
    return {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}[amp]


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model inside DistributedDataParallel and torch.compile wrappers.

    Checkpoints hold its state, so their keys carry no "module." or "_orig_mod." prefixes.
    """
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


def select_device(n_gpu: int, logger: logging.Logger, *, local_rank: int = 0) -> torch.device:
    """cuda:local_rank when n_gpu > 0 and CUDA is present, else the CPU."""
    if n_gpu > 0 and torch.cuda.device_count() == 0:
        logger.info("No CUDA device available: running on the CPU.")
        return torch.device("cpu")
    if n_gpu > 1:
        logger.warning(
            "n_gpu is %d: one process uses one GPU. Launch with torchrun for several GPUs.", n_gpu
        )
    return torch.device("cuda", local_rank) if n_gpu > 0 else torch.device("cpu")

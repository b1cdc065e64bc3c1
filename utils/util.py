"""Errors, seeding, RNG state, torch's global settings, which files are images, and the JSON
every output file is written as."""

import gc
import json
import logging
import math
import os
import random
import signal
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch


class UserError(Exception):
    """A mistake in the user's input (config, CLI, files): reported in one line, exit code 2."""


class ConfigError(UserError):
    """A config file, override or value that cannot be used."""


class DataError(UserError):
    """Data that is missing, empty or unusable (base.base_data_loader.DataError too)."""

    def __init__(self, message: str) -> None:
        # Raised in a DataLoader worker (an unreadable image), it is re-raised in the main
        # process with the worker's whole traceback as its message: keep the line it raised.
        if message.startswith("Caught DataError in DataLoader worker"):
            message = message.rstrip().splitlines()[-1].partition("DataError: ")[2]
        super().__init__(message)


class ConfigValueError(UserError, ValueError):
    """A constructor argument from config that cannot be used.

    Raise it from your own model or data loader for a bad `args` value: ConfigParser.init_obj
    reports it in one line naming the config key. Any other exception raised inside your
    constructor is a bug and keeps its traceback.
    """


class Interrupted(Exception):
    """Training stopped on a signal; `path` is the checkpoint to resume from."""

    def __init__(self, signum: int, path: Path) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}; resume with: -r {path}")
        self.signum, self.path = signum, path


class StopInEpoch(Exception):
    """Raised inside an epoch when a stop was requested: where the epoch stands (batches of
    this rank, samples of all ranks, the metric sums so far over all ranks)."""

    def __init__(self, batches: int, samples: int | None, sums: dict[str, torch.Tensor]) -> None:
        super().__init__(f"stopped after {batches} batches")
        self.batches, self.samples, self.sums = batches, samples, sums


class TrainingError(Exception):
    """Training cannot go on (e.g. a non-finite loss); reported in one line, exit code 1."""


class SaveError(TrainingError):
    """A checkpoint could not be written (a full disk, an I/O error); what was saved before is
    intact. Reported in one line, exit code 1."""


def is_number(value: object) -> bool:
    """An int or a float, not a bool (JSON's true would pass as 1): what a numeric config
    argument is checked with before its range."""
    return isinstance(value, int | float) and not isinstance(value, bool)


# The image files the loaders and predict.py read, by extension (any case): torchvision's
# ImageFolder's, and .jfif and .jpe, JPEGs under other names (Windows saves web images as .jfif).
IMAGE_EXTENSIONS = tuple(
    [".jpg", ".jpeg", ".jfif", ".jpe", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"]
)
# Image formats they do not read: a folder of phone photos (.heic) would otherwise give fewer
# samples than it holds without a word. Other files (.txt, .json) are not images: not counted.
UNREAD_IMAGE_EXTENSIONS = (".heic", ".heif", ".avif", ".gif", ".jxl", ".jp2", ".dng", ".svg")


def json_text(value: object, *, indent: int | None = 4) -> str:
    """`value` as strict JSON (RFC 8259), ending in a newline: a NaN or infinite float (a metric
    of a run whose loss diverged) is written as null. Python's json writes NaN and Infinity,
    which JavaScript's JSON.parse, jq, Go and this project's own read_json refuse; every JSON
    file the project writes goes through here (docs/outputs.md)."""
    return json.dumps(_finite_or_null(value), indent=indent, allow_nan=False) + "\n"


def _finite_or_null(value: object) -> object:
    if isinstance(value, float):  # also numpy's float64, a float subclass
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(item) for item in value]
    return value


def warn_unread_images(
    folder: str | os.PathLike,
    paths: Iterable[str | os.PathLike],
    logger: logging.Logger,
    read: tuple[str, ...] = IMAGE_EXTENSIONS,
) -> None:
    """Warn once for `folder` of the image files among `paths` (hidden ones aside) whose format,
    by extension, is not among `read`: left out, counted by extension."""
    counts = Counter(
        Path(path).suffix.lower()
        for path in paths
        if not Path(path).name.startswith(".")
        and Path(path).suffix.lower() in (*IMAGE_EXTENSIONS, *UNREAD_IMAGE_EXTENSIONS)
        and Path(path).suffix.lower() not in read
    )
    if counts:
        found = ", ".join(f"{count} {suffix}" for suffix, count in sorted(counts.items()))
        logger.warning(
            "%s: left out %d image files of a format not read (%s); convert them to %s to use them",
            folder,
            counts.total(),
            found,
            " or ".join(read) if len(read) < 3 else "JPEG or PNG",
        )


def describe_error(error: BaseException) -> str:
    """'TypeName: first line of the message', for one-line error reports."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def derive_seed(*parts: int) -> int:
    """Mix integers (seed, epoch, rank, ...) into one well-spread 63-bit seed."""
    # SeedSequence hashes the whole tuple, so (1, 2) and (2, 1) give unrelated streams.
    return int(np.random.SeedSequence(list(parts)).generate_state(2, np.uint64)[0] >> 1)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (the CPU, every CUDA device and MPS)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def get_rng_state(device: torch.device) -> dict:
    """Every global RNG state this process uses, as tensors and built-in types (so that
    weights_only loading reads it): python, numpy, torch on the CPU and on `device` (CUDA, MPS)."""
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
        # This process's own GPU only: asking for every device's would start a CUDA context on
        # each GPU of the machine from every rank.
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        # MPS has one generator, returned as a CPU tensor like the others.
        "mps": torch.mps.get_rng_state() if device.type == "mps" else None,
    }


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore what get_rng_state returned. The states must be CPU tensors (load checkpoints
    with map_location="cpu"): torch and numpy refuse any other."""
    version, python_state, gauss = state["python"]
    random.setstate((version, tuple(python_state), gauss))
    numpy_keys, numpy_pos, numpy_has_gauss, numpy_gauss = state["numpy"]
    np.random.set_state(
        ("MT19937", numpy_keys.numpy().astype(np.uint32), numpy_pos, numpy_has_gauss, numpy_gauss)
    )
    torch.set_rng_state(state["torch"])
    cuda_state = state.get("cuda")
    if isinstance(cuda_state, list):  # older checkpoints held every device's state
        index = device.index or 0
        cuda_state = cuda_state[index] if index < len(cuda_state) else None
    # A checkpoint from the CPU resumed on a GPU (or back) has no state for this device.
    if device.type == "cuda" and cuda_state is not None:
        torch.cuda.set_rng_state(cuda_state, device)
    if device.type == "mps" and state.get("mps") is not None:  # older checkpoints have none
        torch.mps.set_rng_state(state["mps"])


def configure_torch(trainer_config: dict, device: torch.device) -> None:
    """Apply trainer.deterministic, and on CUDA cudnn_benchmark and tf32, to torch's global
    settings (utils.distributed.device.check_options notes those two as ignored elsewhere)."""
    if trainer_config["deterministic"]:
        # Bit-exact reruns: refuse non-deterministic kernels (cuBLAS needs this workspace setting).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    if device.type != "cuda":
        return
    # Speed knobs for CUDA: cuDNN picks the fastest kernels by timing them; TF32 runs fp32
    # matrix products on tensor cores with a 10-bit mantissa.
    torch.backends.cudnn.benchmark = trainer_config["cudnn_benchmark"]
    if trainer_config["tf32"] is not None:  # None: torch's own defaults
        set_tf32(trainer_config["tf32"])


def set_tf32(enabled: bool) -> None:
    """TF32 on or off for fp32 matrix products and cuDNN convolutions (and RNNs) alike.

    Through the `allow_tf32` flags, on every torch: they also set torch >= 2.9's per-backend
    `fp32_precision` settings, so both APIs read back what was set. Writing `fp32_precision`
    alone makes torch refuse to read `allow_tf32` and get_float32_matmul_precision() after
    it, and Inductor still reads them (max-autotune's benchmark cache: torch.compile fails).
    """
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def tf32_enabled() -> tuple[bool, bool]:
    """(matrix products, convolutions) use TF32, as set_tf32 set them."""
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


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


def freeze_heap_for_exit() -> None:
    """Make the interpreter's exit quick, once main() has returned: collect what is garbage now
    (finalizers run: loader workers stop, files close), then freeze what is left out of the
    collector's reach. Python's shutdown otherwise runs the collector several times over the
    340,000 objects torch and torchvision hold (0.8 s here, against 0.3 s with this); frozen
    objects are still freed by their reference counts, and the OS reclaims the rest."""
    gc.collect()
    gc.freeze()

"""The device a run uses, and what the template does on each kind of device: decided here only.

select_device turns the config's `device` (and the older `n_gpu`) into a torch.device and
refuses one that is not there; capabilities says what a kind of device supports; check_options
refuses the options it cannot run (or notes those it ignores) before anything is built or
saved. docs/performance.md#devices shows the same decisions as a table.
"""

import json
import logging
import os
import platform
from dataclasses import dataclass
from typing import Any

import torch
from torch.torch_version import TorchVersion

from utils.config.config_checks import DEVICE_NAME
from utils.distributed.process_group import ProcessInfo, default_backend, said_by_rank0
from utils.util import UserError

# The torch release whose MPS backend has GradScaler kernels and an Inductor (compile) backend.
MPS_TRAINING_TORCH = (2, 8)
# torch.cpu's checks for the x86 instructions that compute bf16 (without them oneDNN emulates it).
CPU_BF16_CHECKS = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What the template uses on one kind of device."""

    autocast: tuple[str, ...]  # the trainer.amp values torch.autocast runs there
    grad_scaler: bool  # fp16 loss scaling works: trainer.amp "fp16" can train
    pin_memory: bool  # page-locked host memory speeds up the copies to it
    compile: str  # torch.compile: "yes", "prototype" (allowed, with a warning) or "no"
    cuda_settings: bool  # trainer.tf32 and cudnn_benchmark have an effect
    fused_optimizers: bool  # Adam, AdamW and SGD get their fused kernels by default
    backend: str | None  # the process group's default backend; None: no torchrun
    sync_bn: bool  # SyncBatchNorm runs there (distributed.sync_bn)
    float64: bool  # float64 tensors: the metric sums use them (else compensated float32)


def capabilities(device: torch.device) -> Capabilities:
    """What `device`'s kind supports, with the torch installed."""
    if device.type == "cuda":
        # torch.autocast runs this same check at its first batch, and raises: ask up front.
        autocast = ("bf16", "fp16") if torch.cuda.is_bf16_supported() else ("fp16",)
        return Capabilities(
            autocast=autocast, grad_scaler=True, pin_memory=True, compile="yes",
            cuda_settings=True, fused_optimizers=True, backend="nccl", sync_bn=True, float64=True,
        )  # fmt: skip
    if device.type == "mps":
        recent = TorchVersion(torch.__version__) >= MPS_TRAINING_TORCH
        # Before macOS 14 torch turns bf16 autocast off with a warning, i.e. trains in fp32.
        bf16 = torch.backends.mps.is_macos_or_newer(14, 0)
        # Memory is shared with the CPU, so nothing to pin; no process-group backend reduces
        # MPS tensors (gloo takes CPU and CUDA ones, nccl CUDA ones), so one process only.
        return Capabilities(
            autocast=("bf16", "fp16") if bf16 else ("fp16",), grad_scaler=recent,
            pin_memory=False, compile="prototype" if recent else "no", cuda_settings=False,
            fused_optimizers=False, backend=None, sync_bn=False, float64=False,
        )  # fmt: skip
    # The CPU; any other kind ("meta" in the tests) gets fp32 and nothing else assumed.
    cpu = device.type == "cpu"
    return Capabilities(
        autocast=("bf16", "fp16") if cpu else (), grad_scaler=cpu, pin_memory=False,
        compile="yes" if cpu else "no", cuda_settings=False, fused_optimizers=False,
        backend=default_backend(device), sync_bn=False, float64=cpu,
    )  # fmt: skip


def cpu_computes_bf16() -> bool:
    """Whether this CPU has bf16 instructions (x86: AVX-512 BF16 or AMX tiles); True where torch
    cannot tell (other architectures, a torch without the checks): nothing is claimed then."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return True
    checks = [getattr(torch.cpu, name, None) for name in CPU_BF16_CHECKS]
    return any(check is None or check() for check in checks)


def run_device(
    config: Any,  # parse_config.ConfigParser
    logger: logging.Logger,
    info: ProcessInfo | None = None,
    *,
    training: bool = True,
) -> torch.device:
    """The device of a run (its `device` and `n_gpu`), once check_options accepted its options."""
    info = info or ProcessInfo()
    # Every rank decides from one config alike: its warnings (bf16 emulated, n_gpu ignored) are
    # rank 0's to say, once; errors still come from every rank.
    with said_by_rank0(logger, info.rank, config["trainer"]["verbosity"]):
        device = select_device(
            config["device"], config["n_gpu"], logger, info=info, source=config.source
        )
        check_options(config, device, logger, info=info, training=training)
    return device


def use_device(device: torch.device) -> None:
    """Make a CUDA device the current one: the pin-memory thread, CUDA events and anything made
    without a device then use cuda:N, not GPU 0 (which would get a context of its own)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def select_device(
    requested: str,
    n_gpu: int,
    logger: logging.Logger,
    *,
    info: ProcessInfo | None = None,
    source: str = "config",
) -> torch.device:
    """The device `requested` ("auto", "cpu", "cuda", "cuda:N", "mps") names for this process.

    "auto": the CPU with n_gpu 0, else CUDA, else MPS, else the CPU (with a log line). An
    explicit device wins over n_gpu and must be there: a UserError otherwise. Under torchrun
    "cuda" and "auto" mean cuda:LOCAL_RANK.
    """
    info = info or ProcessInfo()
    if requested == "auto":
        return automatic_device(n_gpu, logger, info, source)
    if requested == "cpu":
        return torch.device("cpu")
    if n_gpu == 0:
        logger.warning('device "%s" is set: n_gpu 0 (the CPU) is ignored.', requested)
    where = f'{source}: device: "{requested}"'
    if requested == "mps":
        if not torch.backends.mps.is_available():
            raise UserError(f"{where}: no MPS device here (Apple silicon and a torch built for it)")
        if info.torchrun:
            raise UserError(
                f"{where}: not under torchrun (no process-group backend reduces MPS tensors); "
                'use "cpu"'
            )
        return torch.device("mps")
    if torch.cuda.device_count() == 0:
        raise UserError(f'{where}: no CUDA device here{visible_devices()}; use "auto" or "cpu"')
    if requested != "cuda" and info.world_size > 1:
        raise UserError(
            f'{where}: under torchrun every process would share that GPU; use "cuda" '
            "(each process takes cuda:LOCAL_RANK)"
        )
    if requested == "cuda":
        return cuda_device(info.local_rank, n_gpu, logger, where, torchrun=info.torchrun)
    return cuda_device(int(requested.partition(":")[2]), n_gpu, logger, where, torchrun=False)


def automatic_device(
    n_gpu: int, logger: logging.Logger, info: ProcessInfo, source: str
) -> torch.device:
    """device "auto": CUDA, else MPS (one process only), else the CPU; the CPU with n_gpu 0."""
    if n_gpu == 0:
        return torch.device("cpu")
    if torch.cuda.device_count() > 0:
        where = f'{source}: device: "auto"'
        return cuda_device(info.local_rank, n_gpu, logger, where, torchrun=info.torchrun)
    if torch.backends.mps.is_available() and not info.torchrun:
        logger.info("No CUDA device; Apple MPS is there: running on mps.")
        return torch.device("mps")
    # Configs with n_gpu 1 run anywhere: on a machine without a GPU they train on the CPU.
    why = "MPS serves one process, not torchrun" if torch.backends.mps.is_available() else "none"
    logger.info("No CUDA device available (MPS: %s): running on the CPU.", why)
    return torch.device("cpu")


def cuda_device(
    index: int, n_gpu: int, logger: logging.Logger, where: str, *, torchrun: bool
) -> torch.device:
    """cuda:index, when that many GPUs are visible (index: torchrun's LOCAL_RANK if torchrun)."""
    count = torch.cuda.device_count()
    if index >= count:
        fix = f"; start at most {count} processes per node" if torchrun else ""
        raise UserError(
            f"{where}: needs cuda:{index}, but {count} CUDA device(s) are visible"
            f"{visible_devices()}{fix}"
        )
    if n_gpu > 1:
        logger.warning(
            "n_gpu is %d: one process uses one GPU. Launch with torchrun for several GPUs.", n_gpu
        )
    return torch.device("cuda", index)


def visible_devices() -> str:
    """' (CUDA_VISIBLE_DEVICES=...)' when set (e.g. by -d), for error messages; else ''."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "" if value is None else f" (CUDA_VISIBLE_DEVICES={value!r})"


def gpu_indices(text: str) -> str:
    """-d's value for CUDA_VISIBLE_DEVICES; a device name there is a mistake for the config key."""
    if DEVICE_NAME.fullmatch(text.strip()):
        raise UserError(
            f"-d {text}: takes GPU indices for CUDA_VISIBLE_DEVICES (e.g. 0 or 0,1), not a "
            'device; the config key "device" chooses that'
        )
    return text


def check_options(
    config: Any,  # parse_config.ConfigParser
    device: torch.device,
    logger: logging.Logger,
    *,
    info: ProcessInfo | None = None,
    training: bool = True,
) -> None:
    """Refuse, in one line naming its key, an option `device` cannot run; log those it ignores."""
    info, options, can = info or ProcessInfo(), config["trainer"], capabilities(device)
    source, kind, version = config.source, device.type, torch.__version__
    amp = options["amp"]
    if amp is not None and amp not in can.autocast:
        runs = " or ".join(json.dumps(name) for name in can.autocast)
        fix = f"set {runs} or null" if runs else "set it null"
        raise UserError(f'{source}: trainer.amp: "{amp}" does not run on {kind}; {fix}')
    if amp == "bf16" and kind == "cpu" and not cpu_computes_bf16():
        logger.warning(
            'trainer.amp "bf16" on a CPU without bf16 instructions (AVX-512 BF16 or AMX): torch '
            "emulates them there, several times slower than fp32 (docs/performance.md); null: fp32"
        )
    if training and amp == "fp16" and not can.grad_scaler:
        raise UserError(
            f'{source}: trainer.amp: "fp16" trains with a GradScaler, which torch {version} has '
            f'not for {kind} (MPS: torch >= 2.8); use "bf16" or null'
        )
    if options["compile"] and can.compile == "no":
        raise UserError(
            f"{source}: trainer.compile: torch {version} cannot compile for {kind} (MPS: "
            "torch >= 2.8); set it false"
        )
    if options["compile"] and can.compile == "prototype":
        logger.warning("trainer.compile on %s: torch's backend there is a prototype.", kind)
    distributed = config["distributed"]
    if info.torchrun and distributed["backend"] == "nccl" and can.backend != "nccl":
        raise UserError(
            f'{source}: distributed.backend: "nccl" reduces CUDA tensors only, and this run is '
            f'on {kind}; use "gloo" or null'
        )
    if info.world_size > 1 and distributed["sync_bn"] and not can.sync_bn:
        raise UserError(f"{source}: distributed.sync_bn: SyncBatchNorm needs CUDA, not {kind}")
    ignored = [key for key in ("tf32", "cudnn_benchmark") if options[key]]
    if ignored and not can.cuda_settings:
        logger.info("trainer.%s: CUDA settings, no effect on %s.", " and ".join(ignored), kind)
    if options["channels_last"] and kind == "mps":
        # pytorch/pytorch#193349: MPS runs the 2D convolution backward in NCHW, with copies.
        logger.warning("trainer.channels_last on mps: may train slower there; measure it.")

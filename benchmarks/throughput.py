"""Training throughput of configs/cifar10_cnn.json's model under each speed knob.

What is measured: samples per second of full training steps (forward, cross-entropy, backward,
SGD step with its optimizer args) of configs/cifar10_cnn.json's CifarCNN (widths 64-128-256, two
convolutions per block) on random 3x32x32 batches already on the device, so that no input
pipeline is measured. Variants: fp32; bf16 autocast; channels_last (NHWC) memory format; both
(that config's setting); torch.compile; and all three together. Each variant gets a fresh model, then warm-up steps
(compilation, cuDNN autotuning, allocator), then timed steps: bracketed by CUDA events on a GPU
(launches are asynchronous, so a wall clock would time the launches), by time.perf_counter on the
CPU. Printed as a table with the speed-up over fp32.

python benchmarks/throughput.py [--device cuda] [--batch-size 128] [--skip-compile]
"""

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as `python benchmarks/throughput.py`: import the project

from model.model import CifarCNN  # noqa: E402

# name -> (autocast dtype, channels_last, compile)
VARIANTS: dict[str, tuple[torch.dtype | None, bool, bool]] = {
    "fp32": (None, False, False),
    "bf16 autocast": (torch.bfloat16, False, False),
    "channels_last": (None, True, False),
    "bf16+channels_last": (torch.bfloat16, True, False),  # cifar10_cnn.json's setting
    "compile": (None, False, True),
    "bf16+cl+compile": (torch.bfloat16, True, True),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--batch-size", type=int, default=128, help="default 128")
    parser.add_argument(
        "--steps", type=int, help="timed steps per round (default: 30 on cuda, 3 on cpu)"
    )
    parser.add_argument(
        "--rounds", type=int, help="timed rounds per variant (default: 5 on cuda, 3 on cpu)"
    )
    parser.add_argument(
        "--warmup", type=int, help="untimed steps first (default: 15 on cuda, 2 on cpu)"
    )
    parser.add_argument("--skip-compile", action="store_true", help="leave out the compiled rows")
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's own choice)")
    return parser.parse_args()


def time_steps(step: Callable[[int], None], num_steps: int, device: torch.device) -> float:
    """Seconds that `num_steps` calls of `step` take on `device`."""
    if device.type != "cuda":
        started = time.perf_counter()
        for index in range(num_steps):
            step(index)
        return time.perf_counter() - started
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for index in range(num_steps):
        step(index)
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1000


def make_step(
    variant: str, config: dict, device: torch.device, batch_size: int
) -> Callable[[int], None]:
    """A fresh model, optimizer and batches for `variant`; returns step(index): one training step."""
    amp_dtype, channels_last, compile_model = VARIANTS[variant]
    torch.manual_seed(0)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    model: nn.Module = CifarCNN(**config["arch"]["args"]).to(device, memory_format=memory_format)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), **config["optimizer"]["args"])
    if compile_model:
        model = torch.compile(model)  # compiled at the first step, i.e. during the warm-up
    num_classes = config["arch"]["args"]["num_classes"]
    # A few distinct batches, cycled: different data each step without any copying in the loop.
    batches = [
        (
            torch.randn(batch_size, 3, 32, 32, device=device).contiguous(
                memory_format=memory_format
            ),
            torch.randint(0, num_classes, (batch_size,), device=device),
        )
        for _ in range(4)
    ]

    def step(index: int) -> None:
        images, targets = batches[index % len(batches)]  # (B, 3, 32, 32), (B,)
        with torch.autocast(device.type, amp_dtype, enabled=amp_dtype is not None):
            loss = nn.functional.cross_entropy(model(images), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    on_cuda = device.type == "cuda"
    num_steps = args.steps or (30 if on_cuda else 3)
    num_warmup = args.warmup if args.warmup is not None else (15 if on_cuda else 2)
    num_rounds = args.rounds or (5 if on_cuda else 3)
    config = json.loads((ROOT / "configs/cifar10_cnn.json").read_text())
    device_name = (
        torch.cuda.get_device_name(device) if on_cuda else f"{torch.get_num_threads()} threads"
    )
    print(
        f"torch {torch.__version__} on {device} ({device_name}); CifarCNN "
        f"{config['arch']['args']['widths']} x{config['arch']['args']['convs_per_block']}, "
        f"batch {args.batch_size}; {num_warmup} warm-up steps, then {num_rounds} rounds of "
        f"{num_steps} timed steps per variant",
        flush=True,
    )
    variants = [name for name in VARIANTS if not (args.skip_compile and VARIANTS[name][2])]
    steps = {variant: make_step(variant, config, device, args.batch_size) for variant in variants}
    for step in steps.values():
        for index in range(num_warmup):  # compilation, cuDNN autotuning, the allocator
            step(index)
    # Rounds cycle through the variants, each round starting one further on, so that load from
    # other processes spreads over all of them; the median round is reported.
    rates: dict[str, list[float]] = {variant: [] for variant in variants}
    for round_index in range(num_rounds):
        shift = round_index % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            seconds = time_steps(steps[variant], num_steps, device)
            rates[variant].append(num_steps * args.batch_size / seconds)

    print(f"{'variant':<18}  {'samples/s':>10}  {'ms/step':>8}  {'vs fp32':>7}  min-max samples/s")
    baseline = statistics.median(rates[variants[0]])
    for variant in variants:
        samples_per_second = statistics.median(rates[variant])
        milliseconds = args.batch_size / samples_per_second * 1000
        spread = f"{min(rates[variant]):.1f}-{max(rates[variant]):.1f}"
        print(
            f"{variant:<18}  {samples_per_second:>10.1f}  {milliseconds:>8.2f}  "
            f"{samples_per_second / baseline:>6.2f}x  {spread}"
        )


if __name__ == "__main__":
    main()

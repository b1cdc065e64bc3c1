"""Honest timing: GPU work measured with CUDA events, the input pipeline's share measured apart."""

import re
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

import torch

Item = TypeVar("Item")


class Stopwatch:
    """Seconds between start() and stop(), on the device's own clock.

    On CUDA a pair of events brackets the queued kernels and is read after a synchronize
    (a wall clock around asynchronous launches measures the launches, not the work);
    on the CPU, time.perf_counter.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.started = 0.0
        if self.cuda:
            self.start_event = torch.cuda.Event(enable_timing=True)
            self.stop_event = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        if self.cuda:
            self.start_event.record()
        else:
            self.started = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self.stop_event.record()
            self.stop_event.synchronize()
            return self.start_event.elapsed_time(self.stop_event) / 1000
        return time.perf_counter() - self.started


class DataWait:
    """Wall time the training loop spends blocked waiting for its next batch."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, batches: Iterable[Item]) -> Iterator[Item]:
        """Yield from `batches`, adding the time each `next` took to self.seconds."""
        iterator = iter(batches)
        while True:
            waited = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self.seconds += time.perf_counter() - waited
            yield batch


# Dense peak FLOP/s (no sparsity) of common GPUs by compute precision, from the vendors'
# datasheets: what model FLOP utilisation (MFU) is measured against. The first name that the
# device's name holds as whole words decides (the PCIe and NVL H100 before the SXM one; "L4" is
# not the L40S, whose peak is three times the L4's, nor "H200" the GH200).
PEAK_FLOPS = {
    "H100 PCIe": {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12},
    "H100 NVL": {"bf16": 835e12, "fp16": 835e12, "tf32": 418e12, "fp32": 60e12},
    "H200 NVL": {"bf16": 835e12, "fp16": 835e12, "tf32": 418e12, "fp32": 60e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "H200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "GH200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "L40S": {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12},
    "L40": {"bf16": 181e12, "fp16": 181e12, "tf32": 90.5e12, "fp32": 90.5e12},
    "L4": {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30e12},
    "V100": {"fp16": 125e12, "fp32": 15.7e12},
}


def precision(options: dict) -> str:
    """The precision most of a step's FLOPs run in: autocast's dtype, else tf32 or fp32."""
    if options["amp"] in ("bf16", "fp16"):
        return options["amp"]
    return "tf32" if options["tf32"] else "fp32"


def peak_flops(device: torch.device, compute: str) -> float | None:
    """The device's dense peak FLOP/s in that precision; None where it is not in PEAK_FLOPS, and
    on a MIG slice, which has a share of the whole GPU's peak."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if re.search(r"\bMIG\b", name):  # "NVIDIA H100 80GB HBM3 MIG 1g.10gb": a slice of its SMs
        return None
    # Whole words: "NVIDIA L40S" holds "L4" as a substring, and "NVIDIA GH200" "H200".
    peaks = next(
        (peaks for key, peaks in PEAK_FLOPS.items() if re.search(rf"\b{re.escape(key)}\b", name)),
        {},
    )
    return peaks.get(compute)

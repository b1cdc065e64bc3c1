"""Honest timing: GPU work measured with CUDA events, the input pipeline's share measured apart."""

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

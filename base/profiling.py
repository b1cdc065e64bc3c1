"""trainer.profile: torch.profiler over a window of the run's first training batches (skip
`wait`, warm up `warmup`, record `active`), on rank 0 unless trainer.profile_all_ranks. It writes
a trace (Perfetto or chrome://tracing open it) and a table of the operators that took the most
time, in the run's log folder, and logs the table. Off, it changes nothing: the batches are the
loader's own iterator, no profiler exists."""

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

import torch
from torch.profiler import ProfilerActivity

if TYPE_CHECKING:
    from base.base_trainer import BaseTrainer

Item = TypeVar("Item")


@contextlib.contextmanager
def profiling(trainer: "BaseTrainer") -> Iterator[None]:
    """Inside the block trainer.profiler records the window trainer.profile names (None: off)."""
    options, rank = trainer.options, trainer.rank
    if options["profile"] is None or (rank != 0 and not options["profile_all_ranks"]):
        yield
        return
    wait, warmup, active = options["profile"]
    out = trainer.config.log_dir / ("profile" if rank == 0 else f"profile-rank{rank}")
    cuda = trainer.device.type == "cuda"

    def save(profiler: torch.profiler.profile) -> None:
        out.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(out / "trace.json"))
        sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        table = profiler.key_averages().table(sort_by=sort, row_limit=15)
        (out / "top_operators.txt").write_text(table + "\n")
        first = wait + warmup + 1
        trainer.logger.info(
            "Profile of training batches %d-%d: %s (Perfetto, chrome://tracing); the top "
            "operators:\n%s", first, first + active - 1, out / "trace.json", table,
        )  # fmt: skip

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    schedule = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1)
    with torch.profiler.profile(
        activities=activities, schedule=schedule, on_trace_ready=save
    ) as profiler:
        trainer.profiler = profiler
        try:
            yield
        finally:
            trainer.profiler = None


def profiled(profiler: torch.profiler.profile | None, batches: Iterable[Item]) -> Iterable[Item]:
    """`batches` with a profiler step after each; `batches` itself when not profiling."""
    return batches if profiler is None else stepped(profiler, batches)


def stepped(profiler: torch.profiler.profile, batches: Iterable[Item]) -> Iterator[Item]:
    for batch in batches:
        yield batch
        profiler.step()

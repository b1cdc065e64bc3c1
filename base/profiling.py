"""trainer.profile: torch.profiler over a window of the run's first training batches (skip
`wait`, warm up `warmup`, record `active`), on rank 0 unless trainer.profile_all_ranks. It writes
a trace (Perfetto or chrome://tracing open it) and a table of the operators that took the most
time, in the run's log folder (a resumed part of the run in a folder of its own), and logs the
table. Off, it changes nothing: the batches are the loader's own iterator, no profiler exists."""

import contextlib
import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path
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
    out = fresh_folder(trainer.config.log_dir / ("profile" if rank == 0 else f"profile-rank{rank}"))
    cuda, first = trainer.device.type == "cuda", wait + warmup + 1
    saved = []

    def save(profiler: torch.profiler.profile) -> None:
        if profiler.step_num < first:  # stopped while waiting or warming up: nothing recorded
            return
        out.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(out / "trace.json"))
        sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        table = profiler.key_averages().table(sort_by=sort, row_limit=15)
        (out / "top_operators.txt").write_text(table + "\n")
        # step_num: the batches stepped so far; fewer than the window when the run ended in it
        # (the profiler stopped with the block, and saved what it recorded).
        last = min(first + active - 1, profiler.step_num)
        ended = "" if last == first + active - 1 else " (the run ended inside the window)"
        trainer.logger.info(
            "Profile of training batches %d-%d%s: %s (Perfetto, chrome://tracing); the top "
            "operators:\n%s", first, last, ended, out / "trace.json", table,
        )  # fmt: skip
        saved.append(out)

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
    if not saved:  # the window began after the run's last batch: nothing was recorded
        trainer.logger.warning(
            "trainer.profile %s: the run trained %d batches, the window records from batch %d "
            "on: no profile written; lower wait and warmup", [wait, warmup, active],
            profiler.step_num, first,
        )  # fmt: skip


def fresh_folder(path: Path) -> Path:
    """`path`, or `<path>-2`, `-3`...: the first that does not exist. A resume logs into the same
    log folder, and its part's profile replaced the one the run's first part wrote."""
    names = (path.name if number == 1 else f"{path.name}-{number}" for number in itertools.count(1))
    return next(path.with_name(name) for name in names if not path.with_name(name).exists())


def profiled(profiler: torch.profiler.profile | None, batches: Iterable[Item]) -> Iterable[Item]:
    """`batches` with a profiler step after each; `batches` itself when not profiling."""
    return batches if profiler is None else stepped(profiler, batches)


def stepped(profiler: torch.profiler.profile, batches: Iterable[Item]) -> Iterator[Item]:
    for batch in batches:
        yield batch
        profiler.step()

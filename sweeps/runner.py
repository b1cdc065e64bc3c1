"""Running a sweep's trials: each one `python train.py ...` in a process of its own, K at once.

A trial is an ordinary train.py run started as a subprocess rather than by calling train.main
in this process: train.py seeds, configures torch and logging, and installs signal handlers
for the whole process, so trials in one process would leak that state into each other; and
separate processes are what lets K trials run at once, each on its own GPU.
"""

import ctypes
import fcntl
import functools
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sweeps.space import Trial
from utils.state.checkpoint import (
    CHECKPOINT_NAME,
    CheckpointError,
    load_checkpoint,
    sorted_checkpoints,
)
from utils.state.run_lock import LOCK
from utils.state.signals import STOP_SIGNALS, StopRequest

TRAIN_SCRIPT = Path(__file__).resolve().parents[1] / "train.py"
POLL_SECONDS = 0.2  # how often the sweep looks at its running trials
# How long a trial waits for its run folder's lock: a trial of a sweep that was killed saves a
# checkpoint on the SIGTERM its parent's death sends, which takes about an epoch's batch.
HELD_WAIT_SECONDS = 120
PR_SET_PDEATHSIG = 1  # prctl option: the signal a process gets when its parent dies (Linux)
# Exit codes of a train.py stopped by a signal after saving (128 + signal), or killed by one.
INTERRUPTED_CODES = {128 + signum for signum in STOP_SIGNALS} | {-signum for signum in STOP_SIGNALS}


def available_cpus() -> int:
    """The CPU cores this process may run on (its affinity, e.g. a SLURM allocation)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def visible_gpus(device: str, n_gpu: int, environ: Mapping[str, str]) -> list[str]:
    """The GPUs to share out among the trials, as CUDA_VISIBLE_DEVICES entries: those this
    process sees when the config's `device` is "cuda", or "auto" with n_gpu > 0; none for the
    CPU, MPS, or one GPU the config names ("cuda:N", which every trial then uses)."""
    if not (device == "cuda" or (device == "auto" and n_gpu > 0)):
        return []
    import torch  # only here: --help and spec errors answer without it

    count = torch.cuda.device_count()  # counts without creating a CUDA context
    listed = [item for item in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if item]
    return (listed or [str(index) for index in range(count)])[:count]


def trial_environment(
    slot: int, *, parallel: int, gpus: list[str], num_cpus: int, environ: Mapping[str, str]
) -> dict[str, str]:
    """The environment of the trial in `slot` (0..parallel-1): its own GPU, shared round-robin
    when there are fewer GPUs than slots; and a share of the CPU threads, since K processes
    that each start one thread per core would fight over the cores (an OMP_NUM_THREADS the
    user set is kept)."""
    env = dict(environ)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[slot % len(gpus)]
    if parallel > 1 and "OMP_NUM_THREADS" not in environ:
        env["OMP_NUM_THREADS"] = str(max(1, num_cpus // parallel))
    return env


def _stop_with_parent(parent: int) -> None:
    """Runs in the trial's process before train.py starts: SIGTERM it when the sweep dies, even
    by SIGKILL, so that no trial outlives its sweep and races the resumed one in its run folder
    (on SIGTERM train.py saves a checkpoint and exits)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the sweep died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def start_process(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """`command` writing its output to log_path (appended: a resumed trial continues it).

    In a session of its own: a Ctrl-C in the terminal then reaches the trial once, forwarded
    by the sweep, and not twice (a second SIGINT makes train.py exit at once without saving).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    on_linux = sys.platform == "linux"
    with open(log_path, "a", encoding="utf-8") as log:  # the child keeps its own copy
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=functools.partial(_stop_with_parent, os.getpid()) if on_linux else None,
        )


def wait_until_free(run_dir: Path, *, timeout: float) -> bool:
    """Wait until no process holds run_dir's lock (train.py's, see utils/state/run_lock.py);
    False if one still does after `timeout` seconds. A sweep run again at once after it was
    killed finds its trials still saving: started now, they would be refused as "in use"."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(run_dir / LOCK, "rb") as file:  # never created here: train.py makes it
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True  # let go at once, on close: the trial takes it
        except FileNotFoundError:
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)
        except OSError:  # a file system that cannot lock: train.py goes on unlocked too
            return True


def wait_for_run_folder(trial: Trial, run_dir: Path, logger: logging.Logger) -> None:
    """Before a trial starts, wait (up to HELD_WAIT_SECONDS) for a process holding its run
    folder to end: then train.py would refuse it as "in use" and the trial fail."""
    if not wait_until_free(run_dir, timeout=0):
        logger.info(
            "%s: its run folder is held by another process (a killed sweep's trial saving its "
            "checkpoint?): waiting up to %d s",
            trial.name,
            HELD_WAIT_SECONDS,
        )
        wait_until_free(run_dir, timeout=HELD_WAIT_SECONDS)  # still held: train.py says so


def epoch_metrics(run_dir: Path, after: int) -> list[tuple[int, dict]]:
    """(epoch, metrics) of each end-of-epoch checkpoint after epoch `after`, oldest first.

    Each checkpoint is renamed into place complete, so any file found can be read; one deleted
    in the meantime (trainer.keep_last) leaves its epoch out.
    """
    found = []
    for path in sorted_checkpoints(run_dir) if run_dir.is_dir() else []:
        match = CHECKPOINT_NAME.fullmatch(path.name)
        epoch = int(match.group(1))
        if match.group(2) is None and epoch > after:  # mid-epoch checkpoints hold no metrics
            try:
                found.append((epoch, load_checkpoint(path)["metrics"]))
            except CheckpointError:
                continue
    return found


@dataclass
class Running:
    """A trial whose process runs."""

    trial: Trial
    process: subprocess.Popen
    slot: int
    run_dir: Path
    started: float
    last_epoch: int = 0  # the newest epoch whose metrics were handed to on_epoch
    pruned: bool = False


def outcome(code: int, *, pruned: bool, stopping: bool, requeued: bool) -> str:
    """A trial's status from its exit code: finished, failed, pruned or interrupted (stopped by
    a signal after saving; the next run of the sweep resumes it)."""
    if pruned:
        return "pruned"
    if code == 0:
        return "interrupted" if requeued else "finished"
    return "interrupted" if stopping or code in INTERRUPTED_CODES else "failed"


def run_trials(
    next_trial: Callable[[], Trial | None],
    start: Callable[[Trial, int], tuple[subprocess.Popen, Path]],
    finish: Callable[[Trial, str, int, float], None],
    *,
    parallel: int,
    on_epoch: Callable[[Trial, int, dict], bool] | None = None,
    requeue_file: Path | None = None,
    signum: int | None = None,
) -> int | None:
    """Keep `parallel` trials running until next_trial() has none left; return the signal that
    stopped the sweep, or None.

    start(trial, slot) starts one and returns its process and run folder; finish(trial,
    status, exit code, seconds) records it. on_epoch(trial, epoch, metrics) is told of each
    epoch a trial ends and returns True to stop it (pruning). SIGTERM, SIGINT and SIGUSR1 are
    passed on to the running trials, which save a checkpoint and exit; no new trial starts
    (none at all when `signum`, a stop signal that came before, is given).
    """
    running: list[Running] = []
    forwarded = False
    with StopRequest() as stop:
        stop.signum = signum
        try:
            while True:
                if stop.signum is not None and not forwarded:
                    for item in running:
                        item.process.send_signal(stop.signum)
                    forwarded = True
                while stop.signum is None and len(running) < parallel:
                    trial = next_trial()
                    if trial is None:
                        break
                    slot = min(set(range(parallel)) - {item.slot for item in running})
                    process, run_dir = start(trial, slot)
                    running.append(Running(trial, process, slot, run_dir, time.monotonic()))
                if not running:
                    return stop.signum
                for item in list(running):
                    if on_epoch is not None and not item.pruned:
                        _watch_epochs(item, on_epoch)
                    code = item.process.poll()
                    if code is None:
                        continue
                    running.remove(item)
                    requeued = requeue_file is not None and requeue_file.exists()
                    status = outcome(
                        code, pruned=item.pruned, stopping=forwarded, requeued=requeued
                    )
                    finish(item.trial, status, code, time.monotonic() - item.started)
                time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:  # a second Ctrl-C: the trials stop at once too
            for item in running:
                item.process.send_signal(signal.SIGINT)
            raise


def _watch_epochs(item: Running, on_epoch: Callable[[Trial, int, dict], bool]) -> None:
    # A cross-validated trial keeps its checkpoints in fold-<i>/, none in its run folder: fold
    # 0 trains first, on the same split in every trial, so its epochs are the ones compared.
    first_fold = item.run_dir / "fold-0"
    folder = first_fold if first_fold.is_dir() else item.run_dir
    for epoch, metrics in epoch_metrics(folder, item.last_epoch):
        item.last_epoch = epoch
        if on_epoch(item.trial, epoch, metrics):
            item.pruned = True
            item.process.send_signal(signal.SIGTERM)  # train.py saves a checkpoint and exits
            return

"""Stop signals that land outside a trial. SLURM's SIGUSR1 (or a SIGTERM) that reaches sweep.py
while it imports, plans or writes the summary would end it with exit 138 (143), and an array
task that ends that way is not requeued: held here, the sweep starts no trial, writes its
summary and decides what the signal means for the task."""

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

# SIGINT is not held: a Ctrl-C while the sweep plans stops it at once, as before any work.
HELD_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class HeldSignal:
    """The first SIGTERM/SIGUSR1 that arrived while held, in `signum` (None: none did)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum


@contextmanager
def held_signals() -> Iterator[HeldSignal]:
    """Hold SIGTERM/SIGUSR1 until the end of the block (run_trials' StopRequest takes over in
    between, and gives them back to this handler when it ends)."""
    held, previous = HeldSignal(), {}
    # Python only lets the main thread install handlers (tests may call from elsewhere).
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, held.handle) for signum in HELD_SIGNALS}
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stopped_task_code(status: str, requeue_file: Path) -> int:
    """The exit code of an array task (--trial with --requeue-file) stopped by a signal, from
    its trial's status: a trial that did not end (pending: the signal came before it started;
    interrupted: its train.py died of the signal before it could save) requeues the task, as
    train.py would, by writing the requeue file; a finished or pruned one needs nothing more
    (0), a failed one is 1."""
    from utils.state.run_folder import request_requeue

    if status in ("finished", "pruned"):
        return 0
    if status == "failed":
        return 1
    return 0 if requeue_file.exists() else request_requeue(requeue_file)

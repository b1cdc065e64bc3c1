"""Turn preemption and Ctrl-C into a flag the training loop polls between steps."""

import signal
import threading
from types import FrameType, TracebackType

# SIGUSR1: what SLURM sends ahead of the time limit with `#SBATCH --signal=SIGUSR1@90`.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class StopRequest:
    """While entered, SIGTERM/SIGINT/SIGUSR1 set `signum` instead of killing the process.

    The loop finishes its current step, saves a checkpoint and exits. A second signal gets
    the default behaviour back (a second Ctrl-C raises KeyboardInterrupt at once).
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopRequest":
        # Python only lets the main thread install handlers (tests may call from elsewhere).
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        for other in STOP_SIGNALS:
            signal.signal(
                other, signal.default_int_handler if other == signal.SIGINT else signal.SIG_DFL
            )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

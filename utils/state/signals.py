"""Turn preemption and Ctrl-C into a flag the training loop polls between steps."""

import signal
import threading
from types import FrameType, TracebackType

# SIGUSR1: what SLURM sends ahead of the time limit with `#SBATCH --signal=SIGUSR1@90`.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class StopRequest:
    """While entered, SIGTERM/SIGINT/SIGUSR1 set `signum` instead of killing the process.

    The loop finishes its current step, saves a checkpoint and exits. A second Ctrl-C raises
    KeyboardInterrupt at once; repeated SIGTERM/SIGUSR1 are ignored, because launchers send
    them more than once (SLURM signals every process of the step, torchrun then forwards
    SIGTERM to its workers) and the save must not be cut short.
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
        if self.signum is None:
            self.signum = signum
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

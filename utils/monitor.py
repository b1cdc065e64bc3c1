"""Which epoch is best, and when to stop early."""

import math


class Monitor:
    """Tracks the best value of one metric ("min" or "max" mode; "off" never improves).

    update() returns True when the epoch improved on the best so far; should_stop is True
    after `early_stop` epochs in a row without improvement (0 or None: never).
    """

    def __init__(self, mode: str, key: str, early_stop: int | None) -> None:
        self.mode = mode
        self.key = key
        self.early_stop = early_stop or 0
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = 0

    def update(self, metrics: dict[str, float]) -> bool:
        if self.mode == "off":
            return False
        value = metrics[self.key]
        improved = value < self.best if self.mode == "min" else value > self.best
        if improved:
            self.best = value
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        return improved

    @property
    def should_stop(self) -> bool:
        return self.early_stop > 0 and self.num_bad_epochs >= self.early_stop

    def state_dict(self) -> dict:
        return {
            "mode": self.mode,
            "key": self.key,
            "best": self.best,
            "num_bad_epochs": self.num_bad_epochs,
        }

    def load_state_dict(self, state: dict) -> bool:
        """Restore best and the bad-epoch count if the checkpoint monitored the same thing."""
        if (state["mode"], state["key"]) != (self.mode, self.key):
            return False
        self.best = state["best"]
        self.num_bad_epochs = state["num_bad_epochs"]
        return True

"""Which epoch is best, and when to stop early (trainer.monitor, early_stop, save_top_k); the
config key itself is parsed by utils/config/monitor.py."""

import math


class Monitor:
    """Tracks the best value of one metric ("min" or "max" mode; "off" never improves).

    update() returns True when the epoch improved on the best so far; should_stop is True
    after `early_stop` epochs in a row without improvement (0 or None: never). rank_top_k()
    keeps the `top_k` best epochs (trainer.save_top_k). A nan value never improves and ranks
    below every number.
    """

    def __init__(self, mode: str, key: str, early_stop: int | None, top_k: int = 0) -> None:
        self.mode = mode
        self.key = key
        self.early_stop = early_stop or 0
        self.best = math.inf if mode == "min" else -math.inf
        self.best_epoch: int | None = None  # the epoch of self.best
        self.num_bad_epochs = 0
        self.top_k = top_k
        self.top: list[tuple[float, int]] = []  # (value, epoch), best first

    def rank_top_k(self, metrics: dict[str, float], epoch: int) -> tuple[bool, list[int]]:
        """Whether `epoch` is among the top_k best so far, and the epochs it pushed out. An
        epoch enters only by beating one of them: an equal value leaves the earlier epoch."""
        if self.mode == "off" or self.top_k == 0:
            return False, []
        sign = 1 if self.mode == "min" else -1
        # Sorted by (nan, signed value, epoch): ties keep the earlier epoch first, and a nan
        # (say F1 of an epoch without a class) ranks below every number; compared as a number
        # it would sort anywhere and push a good epoch's checkpoint out.
        ranked = sorted(
            [*self.top, (metrics[self.key], epoch)],
            key=lambda item: (
                math.isnan(item[0]),
                0 if math.isnan(item[0]) else sign * item[0],
                item[1],
            ),
        )
        self.top, dropped = ranked[: self.top_k], ranked[self.top_k :]
        dropped_epochs = [dropped_epoch for _, dropped_epoch in dropped]
        return epoch not in dropped_epochs, [e for e in dropped_epochs if e != epoch]

    def update(self, metrics: dict[str, float], epoch: int | None = None) -> bool:
        if self.mode == "off":
            return False
        value = metrics[self.key]
        improved = value < self.best if self.mode == "min" else value > self.best
        if improved:
            self.best, self.best_epoch = value, epoch
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
            "best_epoch": self.best_epoch,
            "num_bad_epochs": self.num_bad_epochs,
            "top": [list(item) for item in self.top],
        }

    def load_state_dict(self, state: dict) -> bool:
        """Restore best and the bad-epoch count if the checkpoint monitored the same thing."""
        if (state["mode"], state["key"]) != (self.mode, self.key):
            return False
        self.best, self.best_epoch = state["best"], state.get("best_epoch")
        self.num_bad_epochs = state["num_bad_epochs"]
        self.top = [(value, epoch) for value, epoch in state.get("top", [])][: self.top_k]
        return True

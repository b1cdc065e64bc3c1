"""How the config names the monitored metric (trainer.monitor), checked before anything is built."""

import re

from utils.util import ConfigError

# victoresque/pytorch-template spells monitored metrics "val_loss"; accept it as "val/loss".
MONITOR_PATTERN = re.compile(r"(train|val)[/_](\w+)")


def parse_monitor(
    monitor: str, metric_names: list[str], source: str, *, ema: bool = False
) -> tuple[str, str]:
    """'max val/accuracy' -> ('max', 'val/accuracy'); 'off' -> ('off', ''). With ema, the
    averaged weights' validation metrics (val/ema_accuracy) may be monitored too."""
    if monitor == "off":
        return "off", ""
    mode, _, name = monitor.partition(" ")
    if mode not in ("min", "max"):
        raise ConfigError(
            f'{source}: trainer.monitor: must be "off" or "min|max <metric>", got "{monitor}"'
        )
    match = MONITOR_PATTERN.fullmatch(name.strip())
    known = [
        f"{split}/{metric}" for split in ("val", "train") for metric in ["loss", *metric_names]
    ]
    if ema:
        known += [f"val/ema_{metric}" for metric in ["loss", *metric_names]]
    key = f"{match.group(1)}/{match.group(2)}" if match else name.strip()
    if key not in known:
        raise ConfigError(
            f'{source}: trainer.monitor: unknown metric "{name.strip()}" '
            f"(choose from {', '.join(known)})"
        )
    return mode, key

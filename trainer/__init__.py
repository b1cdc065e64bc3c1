"""The trainer and the evaluation loop shared with test.py."""

from trainer.trainer import Trainer, evaluate

__all__ = ["Trainer", "evaluate"]

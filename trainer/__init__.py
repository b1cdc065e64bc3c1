"""The task's trainers: a config names one in trainer.type (default "Trainer")."""

from trainer.detection import DetectionTrainer
from trainer.distillation import DistillationTrainer
from trainer.trainer import Trainer

__all__ = ["DetectionTrainer", "DistillationTrainer", "Trainer"]

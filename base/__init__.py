"""Abstract base classes: subclass these to plug in your own data, model and trainer."""

from base.base_data_loader import BaseDataLoader, TransformedDataset
from base.base_model import BaseModel
from base.base_trainer import BaseTrainer
from utils.data.sampler import EpochSampler
from utils.evaluation.metric_sums import StatefulMetric, StepOutput

__all__ = [
    "BaseDataLoader",
    "BaseModel",
    "BaseTrainer",
    "EpochSampler",
    "StatefulMetric",
    "StepOutput",
    "TransformedDataset",
]

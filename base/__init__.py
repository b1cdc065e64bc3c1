"""Abstract base classes: subclass these to plug in your own data, model and trainer."""

from base.base_data_loader import BaseDataLoader, EpochSampler, TransformedDataset
from base.base_model import BaseModel
from base.base_trainer import BaseTrainer

__all__ = ["BaseDataLoader", "BaseModel", "BaseTrainer", "EpochSampler", "TransformedDataset"]

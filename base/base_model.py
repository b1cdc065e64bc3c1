"""Base class for every model in model/."""

import abc

import torch
from torch import nn


class BaseModel(nn.Module, abc.ABC):
    """An nn.Module that must define forward and prints its trainable parameter count."""

    @abc.abstractmethod
    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Compute the model output (logits for the classifiers here)."""

    def num_trainable_parameters(self) -> int:
        return sum(parameter.numel() for parameter in self.parameters() if parameter.requires_grad)

    def __str__(self) -> str:
        return f"{super().__str__()}\nTrainable parameters: {self.num_trainable_parameters():,}"

"""Base class for every model in model/."""

import abc
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from utils import ConfigValueError
from utils.distributed.sharding import default_blocks, model_class
from utils.optim.optimizer import name_prefixes, under_prefix

if TYPE_CHECKING:
    from base.base_data_loader import BaseDataLoader


class BaseModel(nn.Module, abc.ABC):
    """An nn.Module that must define forward, prints its trainable parameter count, and can
    freeze parts of itself (arch.freeze in config)."""

    def __init__(self) -> None:
        super().__init__()
        # Names of the frozen submodules: train() leaves them in evaluation mode.
        self.frozen_modules: list[str] = []

    @abc.abstractmethod
    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Compute the model output (logits for the classifiers here)."""

    def fit_data(self, data: "BaseDataLoader") -> None:
        """Called once before training with the run's data loader: fit what the model takes from
        the data, from the training split only (data.training_samples(): the untransformed
        pairs, never validation or test data), into buffers, which checkpoints keep. E.g. the
        statistics TabularMLP standardises its inputs and targets with."""

    def check_inputs(self, inputs: Iterable[Any], where: str) -> None:
        """Refuse, in one line naming `where`, inputs the model has no way to take (a token its
        embedding has no row for), before a forward pass fails deep inside it: test.py passes
        its split's inputs, predict.py those of each file it reads. Lazily: a model that checks
        nothing (this default) reads none."""

    def blocks(self) -> list[nn.Module]:
        """The repeated submodules, in order: FSDP (distributed.strategy "fsdp") shards each on
        its own before the root, and trainer.activation_checkpointing recomputes each. Default:
        default_blocks (utils/distributed/sharding.py): ResNets' layer1..layerN, the children of
        a container named layers, blocks or features. Override it for another architecture."""
        return default_blocks(self)

    def freeze(self, prefixes: list[str]) -> None:
        """Stop training every parameter whose name is a prefix or lies under one (whole name
        parts: "network.layer1" covers "network.layer1.0.conv1.weight", not "network.layer10").

        A prefix that names a submodule also keeps it in evaluation mode while the rest trains,
        so its BatchNorm statistics stay those it was given and its dropout is off. A tied weight
        (one tensor under two names) is matched by either name, and freezing it freezes both.
        """
        # Every name of every parameter: a tied weight is listed once per name it has.
        names = [name for name, _ in self.named_parameters(remove_duplicate=False)]
        modules = dict(self.named_modules())
        for prefix in prefixes:
            matched = [name for name in names if under_prefix(name, prefix)]
            if not matched:
                raise ConfigValueError(
                    f"arch.freeze: {prefix!r} matches no parameter of {type(self).__name__} "
                    f"(names start with: {', '.join(name_prefixes(self))})"
                )
            for name in matched:
                self.get_parameter(name).requires_grad_(False)
            if prefix in modules:
                self.frozen_modules.append(prefix)
        self.train(self.training)

    def train(self, mode: bool = True) -> "BaseModel":
        super().train(mode)
        for name in self.frozen_modules:
            self.get_submodule(name).eval()
        return self

    def num_trainable_parameters(self) -> int:
        return sum(parameter.numel() for parameter in self.parameters() if parameter.requires_grad)

    def __str__(self) -> str:
        return f"{super().__str__()}\nTrainable parameters: {self.num_trainable_parameters():,}"


def model_summary(model: nn.Module) -> str:
    """One line per top-level block and the totals, e.g. "CifarCNN: 1,183,242 parameters
    (1,183,242 trainable): features Sequential 1,171,552; head Linear 11,690"."""

    def count(module: nn.Module) -> int:  # FSDP's too: a DTensor's numel is the whole one's
        return sum(parameter.numel() for parameter in module.parameters())

    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    blocks = "; ".join(
        f"{name} {model_class(child).__name__} {count(child):,}"
        for name, child in model.named_children()
    )
    return (
        f"{model_class(model).__name__}: {count(model):,} parameters ({trainable:,} trainable):"
        f" {blocks}"
    )

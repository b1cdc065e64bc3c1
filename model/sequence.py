"""A sequence classifier: token embedding, a GRU, pooling over the real tokens, a linear head.

Padding (token 0, data_loader/tasks/sequences.py) is told apart by its value, so the model takes
one tensor, tokens (B, T), as every other model here does, and exports with T dynamic."""

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from base import BaseModel
from utils import ConfigValueError
from utils.util import DataError, is_number

PAD = 0  # the padding token the loader pads with


class GRUClassifier(BaseModel):
    """tokens int64 (B, T), padded with 0 -> logits (B, num_classes).

    The GRU runs forwards only, so its output at a real token depends on the tokens up to it and
    never on the padding after it; the mean and the max of those outputs over the real tokens
    alone feed the head. A sequence's logits thus do not depend on how much padding follows it,
    nor on the other sequences of its batch."""

    def __init__(
        self,
        *,
        vocab_size: int,
        num_classes: int,
        embedding_dim: int = 32,
        hidden_size: int = 64,
        num_layers: int = 1,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("num_classes", num_classes),
            ("embedding_dim", embedding_dim),
            ("hidden_size", hidden_size),
            ("num_layers", num_layers),
        ):
            if not (type(value) is int and value > 0):
                raise ConfigValueError(f"{name} must be a positive integer, got {value!r}")
        # 1 would zero every feature the head reads (torch allows it).
        if not (is_number(dropout) and 0 <= dropout < 1):
            raise ConfigValueError(f"dropout must be a number in [0, 1), got {dropout!r}")
        self.vocab_size, self.num_classes = vocab_size, num_classes
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=PAD)
        self.gru = nn.GRU(
            embedding_dim,
            hidden_size,
            num_layers=num_layers,
            batch_first=True,
            dropout=dropout if num_layers > 1 else 0.0,  # between GRU layers only
        )
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(2 * hidden_size, num_classes)

    def fit_data(self, data: Any) -> None:
        """Refuse, before training, tokens the embedding has no row for (else an IndexError from
        inside it, or a device-side assert on a GPU), in the files training reads. The loader's
        vocab_size, when set, checks every file it reads (naming file and line), so it must not
        exceed the model's."""
        data_vocab_size = getattr(data, "vocab_size", None)
        if data_vocab_size is not None and data_vocab_size > self.vocab_size:
            raise ConfigValueError(
                f"arch.args.vocab_size is {self.vocab_size}, but data_loader.args.vocab_size is "
                f"{data_vocab_size}: the embedding has no row for tokens {self.vocab_size} to "
                f"{data_vocab_size - 1}; set arch.args.vocab_size to {data_vocab_size}"
            )
        for split in ("train", "val"):  # the validation data, carved from train or its own
            if split in data.splits:
                tokens = (tokens for tokens, _ in data.dataset(split))
                self.check_inputs(tokens, data.location(split))

    def check_inputs(self, inputs: Iterable[torch.Tensor], where: str) -> None:
        """Refuse token sequences (each (T,), or the rows of (N, T)) holding a token the embedding
        has no row for, naming `where` and the largest: train.py (fit_data), test.py and
        predict.py call it before any forward pass, where it would be an IndexError."""
        largest = max((int(tokens.max()) for tokens in inputs), default=PAD)
        if largest >= self.vocab_size:
            raise DataError(
                f"{where}: token {largest} is outside the vocabulary of arch.args.vocab_size "
                f"{self.vocab_size} (the model's embedding: tokens 1 to {self.vocab_size - 1})"
            )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = (tokens != PAD).unsqueeze(-1)  # (B, T, 1): the real tokens
        outputs, _ = self.gru(self.embedding(tokens))  # (B, T, H)
        # A row of padding alone (the loaders refuse empty sequences) pools to zeros, not NaN.
        mean = (outputs * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (B, H)
        largest = outputs.masked_fill(~mask, float("-inf")).amax(dim=1)  # (B, H)
        largest = torch.where(mask.any(dim=1), largest, torch.zeros_like(largest))
        return self.head(self.dropout(torch.cat([mean, largest], dim=1)))  # (B, num_classes)

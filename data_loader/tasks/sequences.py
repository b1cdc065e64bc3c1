"""Sequences of tokens of any length, one class each: JSONL files, a line per sequence,
{"tokens": [5, 17, 3, ...], "label": "b"}. Batches are padded with token 0 (PAD) to their
longest sequence; the model tells padding from tokens by that value. configs/sequences.json and
docs/extending.md#worked-example-sequences use it with write_sequences' synthetic data."""

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset

from base.base_data_loader import BaseDataLoader
from utils.util import ConfigValueError, DataError

PAD = 0  # the padding token: real tokens are 1 .. vocab_size - 1
SPLIT_FILES = {"train": "train.jsonl", "val": "val.jsonl", "test": "test.jsonl"}


class TokenSequences(Dataset):
    """(tokens int64 (L,), class index) pairs; `targets` holds the class indices."""

    def __init__(self, sequences: list[torch.Tensor], targets: list[int]) -> None:
        self.sequences, self.targets = sequences, targets

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.sequences[index], self.targets[index]


def read_jsonl(path: Path, vocab_size: int | None) -> list[tuple[int, list[int], Any]]:
    """(line number, tokens, label or None) of each line of a JSONL file; a bad line is a
    DataError naming it. Tokens are integers 1 .. vocab_size - 1 (0 is the padding), at least one per line."""
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()  # a BOM (Notepad) is no text
    except OSError as error:
        raise DataError(f"{path}: cannot read ({error.strerror})") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{number}: not JSON ({error.msg})") from None
        tokens = record.get("tokens") if isinstance(record, dict) else None
        if not (
            isinstance(tokens, list)
            and tokens
            and all(type(token) is int and token > PAD for token in tokens)
        ):
            raise DataError(
                f'{path}:{number}: "tokens" must be a non-empty list of integers >= 1 '
                f"({PAD} is the padding)"
            )
        if vocab_size is not None and max(tokens) >= vocab_size:
            raise DataError(
                f"{path}:{number}: token {max(tokens)} is outside the vocabulary of "
                f"data_loader.args.vocab_size {vocab_size}"
            )
        records.append((number, tokens, record.get("label")))
    if not records:
        raise DataError(f"{path}: no sequences in it")
    return records


def pad_batch(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The collate hook: (tokens int64 (B, T) padded with PAD to the longest, labels (B,))."""
    tokens = pad_sequence(
        [sequence for sequence, _ in samples], batch_first=True, padding_value=PAD
    )
    return tokens, torch.tensor([label for _, label in samples], dtype=torch.int64)


class SequenceDataLoader(BaseDataLoader):
    """data_dir/train.jsonl, and val.jsonl and test.jsonl when present (without val.jsonl,
    validation_split takes the validation data from train.jsonl). Each line: {"tokens": [...],
    "label": NAME}. The classes are `class_names` in that order, or by default the labels of
    train.jsonl, sorted. vocab_size: tokens must be below it (the model's embedding size)."""

    mean: tuple[float, ...] = ()  # no images: no normalisation, no TensorBoard grid
    std: tuple[float, ...] = ()
    input_names = ("tokens",)
    dynamic_dims: ClassVar[dict[int, str]] = {1: "length"}  # tokens (B, T): T varies

    def __init__(
        self,
        data_dir: str,
        *,
        vocab_size: int | None = None,
        class_names: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if vocab_size is not None and not (type(vocab_size) is int and vocab_size > 1):
            raise ConfigValueError(f"vocab_size must be an integer > 1, got {vocab_size!r}")
        if class_names is not None and not (
            isinstance(class_names, list)
            and class_names
            and len(set(class_names)) == len(class_names)
        ):
            raise ConfigValueError(
                f"class_names must be a non-empty list of distinct names, got {class_names!r}"
            )
        self.data_dir, self.vocab_size = Path(data_dir), vocab_size
        self._class_names = class_names
        if not (self.data_dir / SPLIT_FILES["train"]).is_file():
            raise DataError(f"{self.data_dir / SPLIT_FILES['train']}: file not found")
        self.splits = tuple(
            split for split, name in SPLIT_FILES.items() if (self.data_dir / name).is_file()
        )

    def location(self, split: str) -> str:
        return str(self.data_dir / SPLIT_FILES[split])

    def load_split(self, split: str) -> Dataset:
        path = Path(self.location(split))
        records = read_jsonl(path, self.vocab_size)
        index = {name: position for position, name in enumerate(self.class_names())}
        targets = []
        for number, _, label in records:
            # A list or an object (several labels) is no class, and cannot be looked up.
            if isinstance(label, list | dict) or label not in index:
                raise DataError(
                    f"{path}:{number}: label {label!r} is not one of the classes "
                    f"{self.class_names()}"
                )
            targets.append(index[label])
        sequences = [torch.tensor(tokens, dtype=torch.int64) for _, tokens, _ in records]
        return TokenSequences(sequences, targets)

    def sample_ids(self, split: str) -> list[str]:
        """A digest of each sequence's tokens and class, for fingerprint(): a resume refuses a
        file whose sequences were edited, replaced or re-sorted since its checkpoint."""
        dataset = self.dataset(split)
        return [
            hashlib.blake2b(f"{sequence.tolist()}:{label}".encode(), digest_size=8).hexdigest()
            for sequence, label in zip(dataset.sequences, dataset.targets, strict=True)
        ]

    def transform(self, augment: bool) -> Callable:
        return identity  # tokens are used as they are

    def class_names(self) -> list[str]:
        if self._class_names is None:
            records = read_jsonl(Path(self.location("train")), self.vocab_size)
            labels = [label for _, _, label in records]
            if not all(isinstance(label, str) for label in labels):  # before a set hashes them
                raise DataError(
                    f'{self.location("train")}: every "label" must be a class name (a string)'
                )
            self._class_names = sorted(set(labels))
        return list(self._class_names)

    def collate(self, split: str) -> Callable:
        return pad_batch  # sequences of unequal length: padded, not stacked

    @classmethod
    def read_inputs(
        cls, path: Path, args: dict, feature_names: list[str] | None = None
    ) -> tuple[list[str], torch.Tensor]:
        """predict.py: the sequences of a JSONL file (a "label" is not needed, and ignored), as
        (path:line of each, tokens int64 (N, T) padded with PAD)."""
        records = read_jsonl(path, args.get("vocab_size"))
        sequences = [torch.tensor(tokens, dtype=torch.int64) for _, tokens, _ in records]
        padded = pad_sequence(sequences, batch_first=True, padding_value=PAD)
        return [f"{path}:{number}" for number, _, _ in records], padded

    @classmethod
    def example_inputs(cls, args: dict, model: torch.nn.Module, batch_size: int) -> torch.Tensor:
        """export.py: random tokens (B, 16) without padding, so that any cut along the length
        is still a batch of sequences (export.py narrows and repeats it)."""
        generator = torch.Generator().manual_seed(0)
        return torch.randint(1, model.vocab_size, (batch_size, 16), generator=generator)


def identity(values: Any) -> Any:
    return values


def write_sequences(
    folder: Path | str,
    *,
    sizes: dict[str, int] | None = None,
    num_classes: int = 3,
    vocab_size: int = 32,
    lengths: tuple[int, int] = (6, 40),
    seed: int = 0,
) -> None:
    """Synthetic data as a user's would be: folder/<split>.jsonl for each split of `sizes`
    (default train 1200, val 300, test 300). Tokens 1 .. num_classes are markers, the others
    noise; a sequence's class is the marker it holds most often (strictly: no ties), among
    a share of the tokens, at random places. Labels are class names: "a", "b", ..."""
    sizes = {"train": 1200, "val": 300, "test": 300} if sizes is None else sizes
    if not (
        1 < num_classes < min(vocab_size - 1, 27) and 2 * num_classes <= lengths[0] <= lengths[1]
    ):
        raise ValueError(
            "need 1 < num_classes < min(vocab_size - 1, 27), 2 num_classes <= lengths[0] <= lengths[1]"
        )
    names = [chr(ord("a") + label) for label in range(num_classes)]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for number, (split, size) in enumerate(sizes.items()):
        split_rng = np.random.default_rng([seed, number])
        lines = []
        for _ in range(size):
            length = int(split_rng.integers(lengths[0], lengths[1] + 1))
            label = int(split_rng.integers(num_classes))
            # The winner's count, then the others' counts, each strictly below it: fewer than
            # `length` markers in all, since top < length / num_classes (or top = 2).
            top = int(split_rng.integers(2, max(3, length // num_classes)))
            others = split_rng.integers(0, top, num_classes - 1)
            counts = np.insert(others, label, top)
            markers = np.repeat(np.arange(1, num_classes + 1), counts)
            noise = split_rng.integers(num_classes + 1, vocab_size, length - len(markers))
            tokens = split_rng.permutation(np.concatenate([markers, noise]))
            lines.append(json.dumps({"tokens": tokens.tolist(), "label": names[label]}))
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":  # python -m data_loader.tasks.sequences [FOLDER]
    import sys

    target = Path(sys.argv[1] if len(sys.argv) > 1 else "data/sequences")
    write_sequences(target)
    print(f"Wrote {', '.join(SPLIT_FILES.values())} in {target}")

"""Rows of numbers: a CSV file, or one of scikit-learn's bundled data sets (an optional extra,
pip install scikit-learn: nothing is downloaded). The non-image example of the template:
configs/tabular.json (a regression) and configs/wine.json (a classification)."""

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from base.base_data_loader import BaseDataLoader
from data_loader.csv_table import read_csv, read_csv_chunks
from utils.data.splits import holdout_split, split_digest
from utils.util import ConfigValueError, DataError, is_number

# scikit-learn's bundled data sets (sklearn.datasets.load_<name>), and the task each is for.
SKLEARN_SETS = {
    "diabetes": "regression",
    "wine": "classification",
    "iris": "classification",
    "breast_cancer": "classification",
}
TASKS = ("regression", "classification")


class TabularDataLoader(BaseDataLoader):
    """Rows of numbers, from `csv` (a CSV file whose `target` column holds the label or value to
    predict; every other column is a feature) or `sklearn` (one of SKLEARN_SETS). task
    "regression": targets float32 (B, 1); "classification": class indices int64 (B,). The test
    split is a seeded `test_split` share of the rows (the validation split is taken from the
    rest). No augmentation; predict.py reads new rows from CSV files (read_inputs)."""

    splits = ("train", "test")
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()

    def __init__(
        self,
        *,
        csv: str | None = None,
        sklearn: str | None = None,
        target: str = "target",
        task: str = "regression",
        test_split: float = 0.2,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (csv is None) == (sklearn is None):
            raise ConfigValueError("give one of csv (a file) and sklearn (a bundled data set)")
        if task not in TASKS:
            raise ConfigValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
        if sklearn is not None and SKLEARN_SETS.get(sklearn) not in (None, task):
            raise ConfigValueError(f"sklearn {sklearn!r} is a {SKLEARN_SETS[sklearn]} data set")
        if sklearn is not None and sklearn not in SKLEARN_SETS:
            raise ConfigValueError(
                f"sklearn must be one of {', '.join(SKLEARN_SETS)}, got {sklearn!r}"
            )
        if not (is_number(test_split) and 0 <= test_split < 1):
            raise ConfigValueError(f"test_split must be a fraction in [0, 1), got {test_split!r}")
        self.csv, self.sklearn, self.target, self.task = csv, sklearn, target, task
        self.test_split = test_split
        self._table: tuple[np.ndarray, np.ndarray] | None = None
        self._classes: list[str] = []
        self._features: list[str] = []
        self._row_ids: list[str] = []

    def location(self, split: str) -> str:
        source = self.csv if self.csv is not None else f"scikit-learn's {self.sklearn} data"
        return f"{source} ({split} split)"

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """(features float32 (N, F), targets (N,)) of every row, read once: a regression's values,
        a classification's class indices 0..K-1, the label values in sorted order (class_names
        keeps the values: labels 1..3 are classes 0..2 named "1", "2", "3")."""
        if self._table is None:
            if self.csv is not None:
                features, targets, self._features, _ = read_csv(Path(self.csv), self.target)
                if targets is None:
                    raise DataError(
                        f"{self.csv}: no column named {self.target!r} (data_loader.args.target)"
                    )
            else:
                try:
                    from sklearn import datasets
                except ImportError:
                    raise DataError(
                        "data_loader.args.sklearn needs scikit-learn: pip install scikit-learn "
                        "(requirements-extras.txt)"
                    ) from None
                bundle = getattr(datasets, f"load_{self.sklearn}")()
                features, targets = bundle.data.astype(np.float32), bundle.target
                self._features = [str(name) for name in bundle.feature_names]
            self._row_ids = row_digests(features, targets)
            if self.task == "classification":
                values, targets = np.unique(targets, return_inverse=True)
                self._classes = [label_name(float(value)) for value in values]
            self._table = features, targets
        return self._table

    def rows(self, split: str) -> np.ndarray:
        """The rows of the table that `split` holds, in order."""
        num_rows = len(self.table()[0])
        # Its own seed, apart from the validation split's: the test rows never train.
        train, test = holdout_split(num_rows, round(num_rows * self.test_split), self.seed + 1)
        return train if split == "train" else test

    def sample_ids(self, split: str) -> list[str]:
        """A digest of each row of `split` (its features and target as read), for fingerprint():
        a resume refuses rows re-sorted, replaced or edited since its checkpoint."""
        return [self._row_ids[row] for row in self.rows(split)]

    def fingerprint(self) -> dict:
        """BaseDataLoader's, and the test split's, which test.py checks: carved from the same
        rows, it is reshuffled by a row added or removed, and would then hold rows that trained."""
        rows = self.sample_ids("test")
        test = split_digest("test", len(rows), np.arange(len(rows)), rows)
        return {**super().fingerprint(), "test": test}

    def load_split(self, split: str) -> Dataset:
        features, targets = self.table()
        rows = self.rows(split)
        inputs = torch.from_numpy(features[rows])  # (N, F) float32
        if self.task == "regression":
            labels = torch.from_numpy(targets[rows].astype(np.float32)).unsqueeze(1)  # (N, 1)
        else:
            labels = torch.from_numpy(targets[rows].astype(np.int64))  # (N,)
        dataset = TensorDataset(inputs, labels)
        dataset.targets = labels.tolist() if self.task == "classification" else None
        return dataset

    def transform(self, augment: bool) -> Callable:
        return identity  # numbers are used as they are; the model standardises them

    def class_names(self) -> list[str]:
        self.table()  # the names are the label values it reads
        return list(self._classes)

    def feature_names(self) -> list[str]:
        """The feature columns' names (the CSV's, or the bundled set's), in the model's order."""
        self.table()
        return list(self._features)

    @classmethod
    def read_inputs(
        cls, path: Path, args: dict, feature_names: list[str] | None
    ) -> tuple[list[str], torch.Tensor]:
        """predict.py: the rows of a CSV file, (a name per row, features float32 (N, F)). The
        features are the training data's columns, by name (`feature_names`, which the checkpoint
        keeps), in the model's order; other columns are left out. A checkpoint from before the
        names were kept gives None: then every column but the target, by position."""
        if feature_names is not None:
            features, _, _, lines = read_csv(path, None, feature_names)
        else:
            features, _, _, lines = read_csv(path, args.get("target", "target"))
        return [f"{path}:{line}" for line in lines], torch.from_numpy(features)

    @classmethod
    def read_input_chunks(
        cls, path: Path, args: dict, feature_names: list[str] | None, num_rows: int
    ) -> Iterator[tuple[list[str], torch.Tensor]]:
        """read_inputs' rows in chunks of at most num_rows, read as they are taken: predict.py
        holds one chunk of a file of millions of rows, not the file."""
        target = None if feature_names is not None else args.get("target", "target")
        for features, _, _, lines in read_csv_chunks(path, target, feature_names, num_rows):
            yield [f"{path}:{line}" for line in lines], torch.from_numpy(features)

    @classmethod
    def example_inputs(cls, args: dict, model: torch.nn.Module, batch_size: int) -> torch.Tensor:
        """export.py: random rows of the model's width (its in_features), (B, F) float32, spread
        as its training rows were where the model keeps their mean and std (TabularMLP): the
        parity check then runs the values it will see, not ones thousands of stds away."""
        generator = torch.Generator().manual_seed(0)
        rows = torch.randn(batch_size, model.in_features, generator=generator)
        mean, std = getattr(model, "input_mean", None), getattr(model, "input_std", None)
        if isinstance(mean, torch.Tensor) and isinstance(std, torch.Tensor):
            rows = (rows * std + mean).float()  # (B, F) * (F,) + (F,)
        return rows


def identity(values: Any) -> Any:
    return values


def row_digests(features: np.ndarray, targets: np.ndarray) -> list[str]:
    """A short hash of each row's bytes: its features (float32) and its target (float64)."""
    shape = len(features), features.shape[1] * 4
    cells = np.ascontiguousarray(features, dtype=np.float32).view(np.uint8).reshape(shape)
    values = np.ascontiguousarray(targets, dtype=np.float64).view(np.uint8).reshape(-1, 8)
    rows = np.concatenate([cells, values], axis=1)  # (N, 4 F + 8) bytes
    return [hashlib.blake2b(row.tobytes(), digest_size=8).hexdigest() for row in rows]


def label_name(value: float) -> str:
    """A class's name: its label value as the CSV would write it ("3", not "3.0"; "0.5")."""
    return str(int(value)) if value.is_integer() else repr(value)

"""predict.py's rows of a loader's inputs, a batch at a time: batches of an input read in chunks
(file_batches), the rows of each (predict_rows) and --out written as they come (RowStream), so
that an input of millions of rows never lies in memory whole, nor do its rows."""

import argparse
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

import torch

from utils.evaluation.predictions import class_labels, format_rows
from utils.util import UserError


class RowStream:
    """--out written a batch of rows at a time into `file` (write_atomic's temporary file), the
    bytes format_rows gives for them all, so that predict.py holds one batch, not every row:
    CSV's header is the first batch's (a model's rows are all of one width), JSON's list is
    opened before the first row and closed by finish(). flat: a loader's own rows, kept until
    finish(), since their CSV header is the union of every row's keys."""

    def __init__(self, file: BinaryIO, suffix: str, *, flat: bool = False) -> None:
        self.file, self.suffix, self.num_rows = file, suffix, 0
        self.flat_rows: list[dict] | None = [] if flat else None

    def write(self, rows: list[dict]) -> None:
        if self.flat_rows is not None:
            self.flat_rows += rows
            return
        if not rows:
            return
        text = format_rows(rows, self.suffix)
        if self.suffix == ".json":  # '[\n  {...},\n  {...}\n]\n': the rows between the brackets
            text = ("[\n" if self.num_rows == 0 else ",\n") + text[2:-3]
        elif self.num_rows:
            text = text.split("\n", 1)[1]  # the header, written with the first batch
        self.file.write(text.encode("utf-8"))
        self.num_rows += len(rows)

    def finish(self) -> None:
        if self.flat_rows is not None:
            text = format_rows(self.flat_rows, self.suffix, flat=True)
        elif self.suffix == ".json":
            text = "\n]\n" if self.num_rows else format_rows([], self.suffix)
        else:
            text = "" if self.num_rows else format_rows([], self.suffix)
        self.file.write(text.encode("utf-8"))


def file_batches(
    chunks: Iterable[tuple[list[str], Any]], batch_size: int
) -> Iterator[tuple[list[str], Any]]:
    """One input's rows (chunks of (names, inputs (N, ...))) in batches of batch_size, the last
    one fewer: the batches of the input read whole, whatever its chunks."""
    names: list[str] = []
    parts: list[torch.Tensor] = []
    for chunk_names, inputs in chunks:
        start = 0
        while start < len(inputs):
            end = min(len(inputs), start + batch_size - len(names))
            names += chunk_names[start:end]
            parts.append(inputs[start:end])
            start = end
            if len(names) == batch_size:
                yield names, parts[0] if len(parts) == 1 else torch.cat(parts)
                names, parts = [], []
    if names:
        yield names, parts[0] if len(parts) == 1 else torch.cat(parts)


def predict_rows(
    args: argparse.Namespace,
    model: object,
    state: dict,
    files: Iterable[Iterable[tuple[list[str], Any]]],
    stream: Any = None,
) -> int:
    """The number of rows of what a loader read from each input (files: its chunks of (names,
    inputs) per input), each printed and written to `stream` (a RowStream) as its batch comes:
    a classifier's top-k classes, else the output values of each row."""
    num_rows = 0
    classes = None
    for chunks in files:
        for names, inputs in file_batches(chunks, args.batch_size):
            with torch.inference_mode():
                outputs = model(inputs).float()  # (B, K)
            if classes is None:  # a classifier's names, one per output (or indices, warned)
                named = bool(state.get("class_names"))
                classes = class_labels(state, outputs.shape[1], args.resume) if named else []
            rows = []
            for name, output in zip(names, outputs, strict=True):
                if classes:
                    top = output.softmax(dim=0).topk(min(args.top_k, len(classes)))
                    labels = [classes[index] for index in top.indices.tolist()]
                    rows.append(
                        {"path": name, "labels": labels, "probabilities": top.values.tolist()}
                    )
                    shown = "  ".join(
                        f"{k} {v:.4f}" for k, v in zip(labels, top.values.tolist(), strict=True)
                    )
                else:
                    rows.append({"path": name, "values": output.reshape(-1).tolist()})
                    # In full: each float32's shortest decimal that reads back as it (not 6 digits)
                    shown = "  ".join(str(value) for value in output.reshape(-1).cpu().numpy())
                print(f"{name}  {shown}")
            if stream is not None:
                stream.write(rows)
            num_rows += len(rows)
    if not num_rows:
        raise UserError(f"{', '.join(args.inputs)}: no rows to predict")
    return num_rows

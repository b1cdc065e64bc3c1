"""A CSV file of numbers with a header row, read whole (training) or in chunks of rows
(predict.py, whose inputs may be millions of rows): the same checks either way, each bad value
or row named by the line it starts on."""

import csv
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from utils.util import DataError

# Cell separators other than the comma that a "CSV" file may have been saved with.
SEPARATORS = {";": "semicolons", "\t": "tabs", "|": "vertical bars"}

# (features float32 (N, F), the target column (N,) or None, feature names, each row's line)
Table = tuple[np.ndarray, np.ndarray | None, list[str], list[int]]


def read_csv(path: Path, target: str | None, features: list[str] | None = None) -> Table:
    """(features float32 (N, F), the `target` column (None without one), feature names, the line
    of the file each row starts on) of a CSV file with a header row. The features are the
    columns named `features`, in that order, the other columns left out; by default every
    column but the target, in the file's order."""
    [table] = list(read_csv_chunks(path, target, features))  # no num_rows: one chunk
    return table


def read_csv_chunks(
    path: Path, target: str | None, features: list[str] | None = None, num_rows: int | None = None
) -> Iterator[Table]:
    """read_csv's tables of at most `num_rows` consecutive rows each (None: one of them all),
    the file read as they are taken: a bad row is found when its chunk is read, so a caller
    that must refuse a bad file before writing anything reads every chunk first."""
    columns: list[str] | None = None
    for header, body, lines in raw_chunks(path, num_rows):
        if columns is None:  # the first chunk: the header's checks, once
            if not body:
                raise DataError(f"{path}: a header row and at least one row of values are needed")
            columns, wanted = header_columns(path, header, target, features)
        for line, row in zip(lines, body, strict=True):
            if len(row) != len(header):
                raise DataError(
                    f"{path}:{line}: {len(row)} values, but the header has {len(header)}"
                )
        positions = [header.index(name) for name in wanted]
        try:
            values = np.asarray([[row[i] for i in positions] for row in body], dtype=np.float64)
        except ValueError:
            values = None
        # float() reads "nan" and "inf" too: a missing value, refused like an empty cell (one NaN
        # feature makes the standardisation, and so every output, NaN; a NaN label a class).
        if values is None or not np.isfinite(values).all():
            raise not_a_number(path, body, lines, dict(zip(wanted, positions, strict=True)))
        labels = values[:, len(columns)] if len(wanted) > len(columns) else None
        yield values[:, : len(columns)].astype(np.float32), labels, columns, lines


def raw_chunks(
    path: Path, num_rows: int | None
) -> Iterator[tuple[list[str], list[list[str]], list[int]]]:
    """(header, rows of cells, the line each row starts on) per chunk of at most num_rows rows;
    one (empty) chunk for a file without rows. Without num_rows the whole file is read before
    the first chunk, so that a byte that is not UTF-8 anywhere in it is the error."""
    try:  # utf-8-sig: Excel's "CSV UTF-8" starts with a byte order mark, not part of a name
        with path.open(newline="", encoding="utf-8-sig") as file:
            reader = csv.reader(file)
            header = next(reader, [])
            end = reader.line_num  # where the row before the next one ends
            body, lines, num_chunks = [], [], 0
            for row in reader:  # a quoted cell may hold line breaks: a row is not a line
                body.append(row)
                lines.append(end + 1)
                end = reader.line_num
                if len(body) == num_rows:
                    yield header, body, lines
                    body, lines, num_chunks = [], [], num_chunks + 1
            if body or not num_chunks:
                yield header, body, lines
    except OSError as error:
        raise DataError(f"{path}: cannot read ({error.strerror})") from None
    except UnicodeDecodeError as error:  # e.g. Excel's plain "CSV", in the system's code page
        byte = error.object[error.start]
        raise DataError(
            f"{path}: not UTF-8 text (byte 0x{byte:02x}): save it as CSV UTF-8"
        ) from None


def header_columns(
    path: Path, header: list[str], target: str | None, features: list[str] | None
) -> tuple[list[str], list[str]]:
    """(the feature columns, the columns to read: those and the target where it is one)."""
    # Excel, where the decimal mark is a comma, saves "CSV" with semicolons: one column, then.
    one_cell = header[0] if len(header) == 1 else ""
    separators = [name for mark, name in SEPARATORS.items() if mark in one_cell]
    if separators:
        raise DataError(
            f"{path}: its cells are separated by {separators[0]}, not commas: save it as CSV with "
            "commas between cells and points in numbers"
        )
    repeated = [name for name, count in Counter(header).items() if count > 1]
    if repeated:
        raise DataError(f"{path}: two columns are named {repeated[0]!r}")
    columns = [name for name in header if name != target] if features is None else features
    missing = [name for name in columns if name not in header]
    if missing:
        raise DataError(
            f"{path}: no column named {', '.join(map(repr, missing))}: the model reads its "
            f"{len(columns)} feature columns by name (other columns are left out)"
        )
    wanted = [*columns, target] if target in header and target not in columns else columns
    return columns, wanted


def not_a_number(
    path: Path, body: list[list[str]], lines: list[int], positions: dict[str, int]
) -> DataError:
    """The error naming the first value of the columns read (name: position) that is not a
    finite number, and its line."""
    for line, row in zip(lines, body, strict=True):
        for name, position in positions.items():
            try:
                finite = math.isfinite(float(row[position]))
            except ValueError:
                finite = False
            if not finite:
                return DataError(
                    f"{path}:{line}: column {name!r}: {row[position]!r} is not a finite number"
                )
    return DataError(f"{path}: every value must be a finite number")

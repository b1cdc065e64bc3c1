"""metrics.csv (a row per epoch) and steps.csv (a row per log_step read) in the run's log folder,
with plain Python csv: a spreadsheet or pandas.read_csv reads them as they are."""

import csv
import io
from collections.abc import Callable
from pathlib import Path

from logger.experiment_logger import ExperimentLogger
from utils.state.checkpoint import write_text_atomic

Row = dict[str, str]


class CsvTable:
    """One CSV file, a row appended and flushed at a time.

    The header is the first row's keys. A later row with a new key rewrites the file with the
    column added (earlier rows leave it empty), so no row ever lands under the wrong header.
    """

    def __init__(self, path: Path, keep: Callable[[Row], bool]) -> None:
        """Open `path`, first dropping the rows that `keep` refuses (those past a resume point)
        and a last line cut short by a crash."""
        self.path, self.header = path, []
        if path.exists():
            rows, self.header, intact = read_rows(path)
            kept = [row for row in rows if keep(row)]
            if len(kept) < len(rows) or not intact:
                self.rewrite(kept)
        self.file = path.open("a", newline="", encoding="utf-8")

    def append(self, row: dict[str, float | int]) -> None:
        if not self.header:
            self.header = list(row)
            self.write_rows([], header=True)
        new_keys = [key for key in row if key not in self.header]
        if new_keys:
            self.file.close()
            rows = read_rows(self.path)[0]
            self.header += new_keys
            self.rewrite(rows)
            self.file = self.path.open("a", newline="", encoding="utf-8")
        self.write_rows([row])

    def write_rows(self, rows: list[dict], *, header: bool = False) -> None:
        writer = csv.DictWriter(self.file, fieldnames=self.header, lineterminator="\n")
        if header:
            writer.writeheader()
        writer.writerows(rows)
        self.file.flush()  # a crash right after loses nothing logged

    def rewrite(self, rows: list[Row]) -> None:
        """Replace the file atomically: a crash mid-way leaves the old one."""
        buffer = io.StringIO()
        if self.header:  # else empty: the next row writes the header
            writer = csv.DictWriter(buffer, fieldnames=self.header, lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        write_text_atomic(self.path, buffer.getvalue())

    def close(self) -> None:
        self.file.close()


def read_rows(path: Path) -> tuple[list[Row], list[str], bool]:
    """(the complete rows, the header, whether the file was intact) of a CSV file. A last line
    without its newline was cut short by a crash: it is left out, as are rows with too few or
    too many cells."""
    text = path.read_text(encoding="utf-8")
    intact = text.endswith("\n")
    if not intact:
        text = text[: text.rfind("\n") + 1]
    reader = csv.DictReader(io.StringIO(text))
    rows = [row for row in reader if None not in row and None not in row.values()]
    return rows, list(reader.fieldnames or []), intact


def position(row: Row, *keys: str) -> tuple[int, ...] | None:
    """The row's integer `keys`, e.g. (epoch, batch); None when one does not parse."""
    try:
        return tuple(int(row[key]) for key in keys)
    except (KeyError, ValueError):
        return None


class CsvLogger(ExperimentLogger):
    """metrics.csv: epoch, step, then every metric; steps.csv: epoch, batch, step, then the
    running loss (and the learning rate with a per-step schedule).

    On resume, the rows past the resume point are dropped first: a run resumed from an earlier
    checkpoint, or in the middle of an epoch, logs each epoch and each step once.
    """

    name = "csv"

    def __init__(self, log_dir: Path, epochs_done: int, batches_done: int) -> None:
        def epoch_done(row: Row) -> bool:
            done = position(row, "epoch")
            return done is not None and done <= (epochs_done,)

        def step_done(row: Row) -> bool:
            done = position(row, "epoch", "batch")
            return done is not None and done <= (epochs_done + 1, batches_done)

        self.metrics = CsvTable(log_dir / "metrics.csv", epoch_done)
        self.steps = CsvTable(log_dir / "steps.csv", step_done)

    def log_step(self, values: dict[str, float], *, step: int, epoch: int, batch: int) -> None:
        self.steps.append({"epoch": epoch, "batch": batch, "step": step, **values})

    def log_epoch(self, metrics: dict[str, float], *, step: int, epoch: int) -> None:
        self.metrics.append({"epoch": epoch, "step": step, **metrics})

    def close(self, *, finished: bool) -> None:
        self.metrics.close()
        self.steps.close()

"""A sweep's records: sweep.json, a record per trial, and the summary that ranks them.

<save_dir>/sweeps/<sweep name>/
    sweep.json                 the space, the base config and the trials
    base_config.json           the base config (file + --set + defaults) every trial starts from
    trials/trial-NNN.json      a trial's status once its process has ended
    trials/trial-NNN.log       its console output
    models/<name>/trial-NNN/   its run folder (checkpoints, config.json), as train.py writes it
    log/<name>/trial-NNN/      its info.log and TensorBoard files
    sweep_summary.csv, sweep_summary.json   the trials ranked by the monitored metric
"""

import contextlib
import csv
import fcntl
import io
import json
import logging
import math
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeps.space import SweepError, Trial
from utils.state.checkpoint import CheckpointError, load_checkpoint, write_text_atomic
from utils.state.run_folder import SUMMARY
from utils.util import json_text

if TYPE_CHECKING:
    from sweeps.plan import Sweep

# Statuses a trial keeps: the next run of the sweep skips it. Any other (failed, interrupted,
# or no record yet: pending) runs again, resuming from the trial's newest checkpoint.
DONE = ("finished", "pruned")
BASE_CONFIG = "base_config.json"


def write_json(path: Path, value: Any) -> None:
    write_text_atomic(path, json_text(value))


@contextlib.contextmanager
def locked(path: Path, *, wait: bool) -> Iterator[None]:
    """An exclusive lock on `path` while inside; without `wait`, a SweepError if it is held.
    Where the file system cannot lock (ENOLCK: NFS or Lustre without locks), a warning."""
    with open(path, "a") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise SweepError(
                f"{path.parent}: another sweep.py is running this sweep; wait for it, or "
                "stop it (it passes the stop on to its trials, which save a checkpoint)"
            ) from None
        except OSError as error:  # as train.py's run lock: go on unlocked rather than stop
            logging.getLogger("sweep").warning(
                "%s: cannot lock (%s): a second sweep.py on this sweep is not noticed.",
                path, error.strerror,
            )  # fmt: skip
        yield  # the lock goes when the file is closed, also if this process dies


def check_definition(sweep_dir: Path, definition: dict, num_trials: int) -> None:
    """Refuse to continue a sweep of the same name that was started with something else."""
    path = sweep_dir / "sweep.json"
    if not path.is_file():
        return
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        before, num_before = stored["definition"], stored["num_trials"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise SweepError(f"{path}: not a sweep.json written by sweep.py") from None
    changed = [
        key for key in sorted({*before, *definition}) if before.get(key) != definition.get(key)
    ]
    if changed:
        raise SweepError(
            f"{path}: this sweep was started with another {' and '.join(changed)}; choose "
            f"another --name, or delete {sweep_dir} to start it again"
        )
    if num_trials < num_before:
        raise SweepError(
            f"{path}: this sweep has {num_before} trials; ask for {num_before} or more"
        )


def record_path(sweep_dir: Path, trial: Trial, suffix: str = ".json") -> Path:
    return sweep_dir / "trials" / f"{trial.name}{suffix}"


def read_status(sweep_dir: Path, trial: Trial) -> str:
    """finished, failed, pruned, interrupted, or pending (never ended)."""
    path = record_path(sweep_dir, trial)
    if not path.is_file():
        return "pending"
    return json.loads(path.read_text(encoding="utf-8"))["status"]


def write_record(sweep_dir: Path, trial: Trial, *, status: str, code: int, run_dir: Path) -> None:
    values = {"trial": trial.index, "status": status, "exit_code": code, "values": trial.values}
    write_json(record_path(sweep_dir, trial), {**values, "run_dir": str(run_dir)})


def last_error(log_path: Path, start: int = 0, code: int = 1) -> str:
    """The line of a trial's output that says why it failed: its `error:` line, else its last;
    for a process killed by a signal (exit code -N), the signal, since whatever it printed last
    (e.g. "Outputs: ...") is not why. Only what follows byte `start` counts: the log of a trial
    that runs again is appended to."""
    if code < 0:
        with contextlib.suppress(ValueError):
            name = signal.Signals(-code).name
            return f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    with open(log_path, "rb") as file:
        file.seek(start)
        text = file.read().decode(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["(no output)"])[-1].strip()


def best_value(run_dir: Path, key: str) -> tuple[float | None, int | None]:
    """The monitored metric `key` and epoch of the run's model_best.pth; for a cross-validation
    run (its checkpoints in fold-<i>/), its pooled value over all folds' samples (else the
    mean over the folds) and no epoch; or (None, None)."""
    path = run_dir / "model_best.pth"
    if not path.is_file() and (run_dir / SUMMARY).is_file():
        metrics = json.loads((run_dir / SUMMARY).read_text(encoding="utf-8"))["metrics"]
        values = metrics.get(key, {})
        # pooled: the metric of every out-of-fold prediction at once, exact, where the folds'
        # mean weighs a small fold as much as a large one; mean_over_folds for a metric not
        # pooled (the summary's not_pooled), "mean" in a summary written before either.
        name = next((name for name in ("pooled", "mean_over_folds", "mean") if name in values), "")
        return values.get(name), None
    if not path.is_file():
        return None, None
    try:
        state = load_checkpoint(path)
    except CheckpointError:  # damaged: the trial's row shows no value rather than no summary
        return None, None
    value = state["metrics"].get(key)
    return (float(value) if value is not None else None), state["epoch"]


def summarize(
    sweep_dir: Path, trials: list[tuple[Trial, Path]], *, mode: str, key: str
) -> list[dict]:
    """One row per trial, ranked: finished trials by their best `key` (mode "max": highest
    first), then the others in trial order, unranked."""
    rows = []
    for trial, run_dir in trials:
        value, epoch = best_value(run_dir, key)
        status = read_status(sweep_dir, trial)
        rows.append(
            {
                "rank": None,
                "trial": trial.name,
                "status": status,
                "value": value,
                "epoch": epoch,
                "values": trial.values,
                "run_dir": str(run_dir),
            }
        )
    sign = -1 if mode == "max" else 1
    ranked = sorted(
        (row for row in rows if row["status"] == "finished" and _finite(row["value"])),
        key=lambda row: sign * row["value"],
    )  # sorted is stable: equal values keep trial order
    for rank, row in enumerate(ranked, start=1):
        row["rank"] = rank
    return ranked + [row for row in rows if row["rank"] is None]


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def write_summary(sweep_dir: Path, rows: list[dict], *, monitor: str, key: str) -> None:
    """sweep_summary.json and sweep_summary.csv (a column per swept key)."""
    write_json(sweep_dir / "sweep_summary.json", {"monitor": monitor, "trials": rows})
    swept = list(rows[0]["values"]) if rows else []
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["rank", "trial", "status", key, "epoch", *swept, "run_dir"])
    for row in rows:
        values = [_cell(row["values"].get(name)) for name in swept]
        writer.writerow(
            [_cell(row[name]) for name in ("rank", "trial", "status", "value", "epoch")]
            + values
            + [row["run_dir"]]
        )
    write_text_atomic(sweep_dir / "sweep_summary.csv", text.getvalue())


def _cell(value: Any) -> str:
    """A CSV cell: numbers and strings as they are, lists and objects as JSON, None empty."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def top_rows(rows: list[dict], *, key: str, count: int = 5) -> list[str]:
    """The first `count` rows as aligned text lines for the log."""
    swept = list(rows[0]["values"]) if rows else []
    table = [["rank", "trial", "status", key, *swept]]
    for row in rows[:count]:
        value = "" if row["value"] is None else f"{row['value']:.4g}"
        cells = [_cell(row["rank"]), row["trial"], row["status"], value]
        table.append(cells + [_cell(row["values"].get(name)) for name in swept])
    widths = [max(len(line[column]) for line in table) for column in range(len(table[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in table
    ]


def summarize_sweep(sweep: "Sweep", trials: list["Trial"]) -> None:
    """sweep_summary.csv and .json, and the best trials in the log."""
    # Array tasks end at the same time: the last to take the lock sees every record.
    with locked(sweep.sweep_dir / ".summary.lock", wait=True):
        pairs = [(trial, sweep.run_dir(trial)) for trial in trials]
        rows = summarize(sweep.sweep_dir, pairs, mode=sweep.mode, key=sweep.key)
        write_summary(sweep.sweep_dir, rows, monitor=sweep.monitor, key=sweep.key)
    logger = logging.getLogger("sweep")
    logger.info("Trials by %s (%s):", sweep.monitor, sweep.sweep_dir / "sweep_summary.csv")
    for line in top_rows(rows, key=sweep.key):
        logger.info("  %s", line)

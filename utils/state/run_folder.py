"""The run folder: its shared id, whether to resume into it, taking it, creating it.

Under torchrun, train.py calls find_resume_point and prepare_run_folder on rank 0 alone
(utils.distributed.process_group.on_rank0): the other ranks must not race its writes, and an error must reach
every rank rather than leave them waiting.
"""

import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from utils.config.config_checks import NAME
from utils.distributed.process_group import process_info
from utils.state.checkpoint import TEMPORARY_NAME, remove_temporaries, write_text_atomic
from utils.state.run_lock import LOCK, take_run_folder
from utils.state.sharded import FOLDER_GLOB, collect_garbage
from utils.state.timeline import (
    ABANDONED,
    ResumePoint,
    choose,
    from_file,
    new_timeline_id,
    set_aside,
)
from utils.state.training_state import drop_oldest
from utils.util import UserError, json_text

if TYPE_CHECKING:
    from parse_config import ConfigParser

LOG_FOLDER = "log"  # the logs of a run folder resumed outside a save folder (parse_config.py)
SUMMARY = "folds_summary.json"  # a cross-validation's summary, beside its fold-<i>/ folders
# What a folder holds besides a run's files: it makes no folder hold a run.
NOT_THE_RUNS = (LOCK, LOG_FOLDER)


def default_run_id(own: str, broadcast: Callable[[object], object]) -> str:
    """One run id for every rank. Under torchrun: the rendezvous id, which stays the same when an
    elastic restart relaunches the workers, so they find their run again. One that is no
    folder name (--rdzv-id=.. would name saved/models/<name>/..) is passed over, as --run-id's
    would be refused."""
    elastic_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if elastic_id != "none" and NAME[0](elastic_id):
        return elastic_id
    return str(broadcast(own))


def is_restartable(run_dir: Path) -> bool:
    """A run folder that holds its config.json and nothing else of note (what a save cut short
    left, temporary files and shards folders, an abandoned/ folder, the lock, a copy's log/):
    the run stopped before its first checkpoint, so it can start again from epoch 1 without
    losing anything."""
    names = [
        path.name
        for path in run_dir.iterdir()
        if not (TEMPORARY_NAME.fullmatch(path.name) or path.match(FOLDER_GLOB))
        and path.name not in (ABANDONED, *NOT_THE_RUNS)
    ]
    return names == ["config.json"]


def exists(run_dir: Path) -> bool:
    """A run folder that holds a run. One that holds only its config.json stopped before its
    first checkpoint: a new run may start there again (unless a process still trains there,
    which the lock tells)."""
    return (
        run_dir.is_dir()
        and any(path.name not in NOT_THE_RUNS for path in run_dir.iterdir())
        and not is_restartable(run_dir)
    )


def not_a_run(run_dir: Path) -> UserError:
    return UserError(
        f"{run_dir}: holds files but no checkpoint to resume (another kind of run, e.g. a "
        "cross-validation's folds); choose another --run-id"
    )


def is_fold_of(path: Path, num_folds: int) -> bool:
    """`path` is fold-<i>/ of a cross-validation of `num_folds` folds: i < num_folds, and its
    config.json, once written, records num_folds."""
    match = re.fullmatch(r"fold-(\d+)", path.name)
    if not (match and path.is_dir() and int(match.group(1)) < num_folds):
        return False
    config_path = path / "config.json"
    if not config_path.exists():  # the fold stopped before writing it, or is starting
        return True
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        return config["data_loader"]["args"]["folds"] == num_folds
    except (OSError, ValueError, KeyError, TypeError):
        return False


def check_cross_validation(config: "ConfigParser") -> None:
    """A fold trains in its cross-validation's run folder: refuse one that holds anything but
    that cross-validation's fold-<i>/ folders and its summary (an ordinary run's checkpoints,
    the folds of another number of folds)."""
    run_dir, num_folds = config.run_checkpoint_dir, config.num_folds
    if config.fold is None or not run_dir.is_dir():
        return
    for path in sorted(run_dir.iterdir()):
        if path.name in (SUMMARY, *NOT_THE_RUNS) or TEMPORARY_NAME.fullmatch(path.name):
            continue
        if not is_fold_of(path, num_folds):
            raise UserError(
                f"{run_dir}: holds another run ({path.name}), not a cross-validation of "
                f"{num_folds} folds; choose another --run-id"
            )


def find_resume_point(config: "ConfigParser", logger: logging.Logger | None = None) -> ResumePoint:
    """Where the run starts (reads only; rank 0): the checkpoint -r names, or the newest that
    loads of a run folder's timeline (-r RUN_FOLDER, trainer.auto_resume, an elastic restart),
    else epoch 1 of a new run. `logger` takes the warnings (default: train's)."""
    logger = logger or logging.getLogger("train")
    check_cross_validation(config)
    run_dir, resume = config.checkpoint_dir, config.resume
    log_dir = config.log_dir
    if not run_dir.exists() and log_dir.is_dir() and any(log_dir.iterdir()):
        # No run of this id, yet its log folder holds files: tune.py's (the same folder), or the
        # logs of a run whose checkpoints were deleted. A new run would write among them.
        raise UserError(
            f"{log_dir}: holds files of another command (tune.py's, or a run whose checkpoint "
            "folder is gone); choose another --run-id"
        )
    same_run = not config.fine_tune
    # An elastic restart is by definition the same run.
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if config.fine_tune and exists(run_dir):
        # The new run's folder holds a run already (--run-id, a fixed --rdzv-id): its own
        # earlier attempt when it is restarted or auto-resumed, else another run, never touched.
        if not (restarted or config["trainer"]["auto_resume"]):
            raise UserError(
                f"{run_dir}: this run already exists; fine-tune into another --run-id (or "
                "set trainer.auto_resume to continue this one)"
            )
        point = choose(run_dir, logger)
        if point is None:  # no checkpoint, yet more than a config.json: not this run's
            raise not_a_run(run_dir)
        return point  # the fine-tune's own run: continued as any run is
    if resume is not None and not resume.is_dir():
        return from_file(resume, same_run=same_run)
    if resume is not None or config["trainer"]["auto_resume"] or restarted:
        folder = resume if resume is not None else run_dir
        point = choose(folder, logger) if folder.is_dir() else None
        if point is not None and not same_run:  # fine-tuning from it: a new run
            return ResumePoint(point.path, new_timeline_id(), new_timeline=True, fine_tune=True)
        if point is not None:
            return point
        if resume is not None and not (same_run and is_restartable(folder)):
            if folder.is_dir() and is_restartable(folder):
                raise UserError(
                    f"{folder}: no checkpoint to start from; drop -c to restart this run with "
                    "its own config.json"
                )
            raise UserError(f"{folder}: no checkpoint-epoch*.pth in this run folder")
        if resume is None and exists(run_dir):
            raise not_a_run(run_dir)
    elif exists(run_dir) and config.num_folds is not None:
        # -r <fold> would resume that fold alone: auto_resume continues every fold the command
        # trains (those finished train nothing).
        raise UserError(
            f"{config.run_checkpoint_dir}: this cross-validation already exists; continue it "
            "with this command and --set trainer.auto_resume=true, or choose another --run-id"
        )
    elif exists(run_dir):
        raise UserError(
            f"{run_dir}: this run already exists; resume it with -r {run_dir}, set "
            "trainer.auto_resume, or choose another --run-id"
        )
    return ResumePoint(None, new_timeline_id())


def prepare_run_folder(
    config: "ConfigParser", point: ResumePoint, locks: contextlib.ExitStack
) -> None:
    """Take the run folder (its lock, held until `locks` closes), check that it is still what
    find_resume_point saw, create the log folder, clear what saves cut short left there, make
    `point` the head of the run's timeline (setting aside what came after it), and write the
    effective config."""
    logger = logging.getLogger("train")
    try:
        take_run_folder(config, locks)
        # Another start may have written here since find_resume_point looked (two at once):
        # the same answer now, under the lock, or a refusal. Its warnings were given already.
        again = find_resume_point(config, logging.Logger("recheck", logging.CRITICAL + 1))
        if (again.path, again.set_aside, again.fine_tune) != (
            point.path, point.set_aside, point.fine_tune,
        ):  # fmt: skip
            raise UserError(
                f"{config.checkpoint_dir}: changed while this run was starting (another "
                "process wrote there); start it again"
            )
        config.log_dir.mkdir(parents=True, exist_ok=True)
        removed = remove_temporaries(config.checkpoint_dir) + remove_temporaries(config.log_dir)
        if removed:
            names = ", ".join(path.name for path in removed)
            logger.info("Removed %d file(s) left by saves cut short: %s", len(removed), names)
        if not point.fine_tune:
            set_aside(config.checkpoint_dir, point, logger)
            # A kill between a save and its deletions left one checkpoint too many.
            drop_oldest(config.checkpoint_dir, config["trainer"]["keep_last"])
        # Shards folders no checkpoint names: a save cut short, or the kill above.
        cleared = collect_garbage(config.checkpoint_dir)
        if cleared:
            logger.info("Removed %d shards folder(s) no checkpoint names: %s", len(cleared),
                        ", ".join(cleared))  # fmt: skip
        write_text_atomic(config.checkpoint_dir / "config.json", json_text(config.config))
    except OSError as error:
        raise UserError(
            f"{error.filename or config.checkpoint_dir}: cannot write the run folder "
            f"({error.strerror}); check trainer.save_dir"
        ) from None


def request_requeue(path: Path) -> int:
    """Write the file a job script reads as "checkpoint saved, requeue me" (rank 0); the exit
    code 0 tells torchrun that the worker did not crash, so --max-restarts does not restart it."""
    if not process_info().is_main:
        return 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, "preempted: the newest checkpoint resumes the run\n")
    except OSError as error:
        print(f"error: {path}: cannot write ({error.strerror})", file=sys.stderr)
        return 1
    return 0

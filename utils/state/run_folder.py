"""The run folder: its shared id, whether to resume into it, creating it.

Under torchrun, train.py calls find_resume_point and prepare_run_folder on rank 0 alone
(utils.distributed.process_group.on_rank0): the other ranks must not race its writes, and an error must reach
every rank rather than leave them waiting.
"""

import json
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from utils.distributed.process_group import process_info
from utils.state.checkpoint import TEMPORARY_NAME, remove_temporaries, write_text_atomic
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
from utils.util import UserError

if TYPE_CHECKING:
    from parse_config import ConfigParser


def default_run_id(own: str, broadcast: Callable[[object], object]) -> str:
    """One run id for every rank. Under torchrun: the rendezvous id, which stays the same when an
    elastic restart relaunches the workers, so they find their run again."""
    elastic_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if elastic_id != "none" and re.fullmatch(r"[A-Za-z0-9._-]+", elastic_id):
        return elastic_id
    return str(broadcast(own))


def is_restartable(run_dir: Path) -> bool:
    """A run folder that holds its config.json and nothing else of note (what a save cut short
    left, temporary files and shards folders, or an abandoned/ folder): the run stopped before
    its first checkpoint, so it can start again from epoch 1 without losing anything."""
    names = [
        path.name
        for path in run_dir.iterdir()
        if not (TEMPORARY_NAME.fullmatch(path.name) or path.match(FOLDER_GLOB))
        and path.name != ABANDONED
    ]
    return names == ["config.json"]


def exists(run_dir: Path) -> bool:
    """A run folder that holds a run. One that holds only its config.json stopped before its
    first checkpoint: a new run may start there again."""
    return run_dir.is_dir() and any(run_dir.iterdir()) and not is_restartable(run_dir)


def find_resume_point(config: "ConfigParser") -> ResumePoint:
    """Where the run starts (reads only; rank 0): the checkpoint -r names, or the newest that
    loads of a run folder's timeline (-r RUN_FOLDER, trainer.auto_resume, an elastic restart),
    else epoch 1 of a new run."""
    logger = logging.getLogger("train")
    run_dir, resume = config.checkpoint_dir, config.resume
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
        if point is not None:  # the fine-tune's own run: continued as any run is
            return point
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
    elif exists(run_dir):
        raise UserError(
            f"{run_dir}: this run already exists; resume it with -r {run_dir}, set "
            "trainer.auto_resume, or choose another --run-id"
        )
    return ResumePoint(None, new_timeline_id())


def prepare_run_folder(config: "ConfigParser", point: ResumePoint) -> None:
    """Create the run's folders, clear what saves cut short left there, make `point` the head of
    the run's timeline (setting aside what came after it), and write the effective config."""
    logger = logging.getLogger("train")
    try:
        config.checkpoint_dir.mkdir(parents=True, exist_ok=True)
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
        text = json.dumps(config.config, indent=4) + "\n"
        write_text_atomic(config.checkpoint_dir / "config.json", text)
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

"""The run folder: its shared id, whether to resume into it, creating it.

Under torchrun, train.py calls find_resume_point and prepare_run_folder on rank 0 alone
(utils.distributed.on_rank0): the other ranks must not race its writes, and an error must reach
every rank rather than leave them waiting.
"""

import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from utils.checkpoint import latest_checkpoint, write_text_atomic
from utils.distributed import process_info
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
    """A run folder that holds its config.json and nothing else: the run stopped before its
    first checkpoint, so it can start again from epoch 1 without losing anything."""
    return [path.name for path in run_dir.iterdir()] == ["config.json"]


def find_resume_point(config: "ConfigParser") -> Path | None:
    """The checkpoint to start from: -r, else auto-resume, else None (a fresh run)."""
    if config.resume is not None:
        return config.resume
    run_dir = config.checkpoint_dir
    latest = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    # An elastic restart is by definition the same run.
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if config["trainer"]["auto_resume"] or restarted:
        return latest
    # A folder that holds only config.json stopped before its first checkpoint: start it again.
    if run_dir.is_dir() and any(run_dir.iterdir()) and not is_restartable(run_dir):
        raise UserError(
            f"{run_dir}: this run already exists; resume it with -r {run_dir}, set "
            "trainer.auto_resume, or choose another --run-id"
        )
    return None


def prepare_run_folder(config: "ConfigParser") -> None:
    """Create the run's folders and write its effective config."""
    try:
        config.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        config.log_dir.mkdir(parents=True, exist_ok=True)
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

"""The run folder: its shared id, whether to resume into it, creating it.

Under torchrun, train.py calls find_resume_point and prepare_run_folder on rank 0 only and
broadcasts the outcome: the other ranks must not race its writes, and an error must reach every
rank rather than leave them waiting.
"""

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from utils.checkpoint import latest_checkpoint, write_text_atomic

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


def find_resume_point(config: "ConfigParser") -> tuple[Path | None, str | None]:
    """(checkpoint to start from, error): -r, else auto-resume, else a fresh run in a new folder."""
    if config.resume is not None:
        return config.resume, None
    run_dir = config.checkpoint_dir
    latest = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    # An elastic restart is by definition the same run.
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if config["trainer"]["auto_resume"] or restarted:
        return latest, None
    # A folder that holds only config.json stopped before its first checkpoint: start it again.
    if run_dir.is_dir() and any(run_dir.iterdir()) and not is_restartable(run_dir):
        return None, (
            f"{run_dir}: this run already exists; resume it with -r {run_dir}, set "
            "trainer.auto_resume, or choose another --run-id"
        )
    return None, None


def prepare_run_folder(config: "ConfigParser") -> str | None:
    """Create the run's folders and write its effective config; an error message on failure."""
    try:
        config.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        config.log_dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps(config.config, indent=4) + "\n"
        write_text_atomic(config.checkpoint_dir / "config.json", text)
    except OSError as error:
        return (
            f"{error.filename or config.checkpoint_dir}: cannot write the run folder "
            f"({error.strerror}); check trainer.save_dir"
        )
    return None

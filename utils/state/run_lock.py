"""One process trains in a run folder at a time.

From prepare_run_folder until its run ends, rank 0 holds <run folder>/.lock (flock, which the OS
lets go when the process dies however it dies: a restart after a crash, an elastic restart or
auto_resume finds the folder free). A start that finds it held is refused in one line. The
file goes when the run ends; one left by a killed run is taken over by the next. Where the
file system cannot lock, the run goes on unlocked with a warning and makes no file.
"""

import contextlib
import errno
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from utils.util import UserError

if TYPE_CHECKING:
    from parse_config import ConfigParser

LOCK = ".lock"  # <folder>/.lock: held by the process training there


def take_run_folder(config: "ConfigParser", locks: contextlib.ExitStack) -> None:
    """Create the run folder and hold its lock until `locks` closes. The folds of one
    cross-validation may train at the same time (a SLURM array): each holds the run folder's
    lock shared, so that no ordinary run takes it, and its own fold-<i>/'s alone."""
    run_dir = config.run_checkpoint_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    locks.enter_context(held(run_dir, shared=config.fold is not None))
    if config.fold is not None:  # after the run folder's lock: never a fold-<i>/ in another run
        config.checkpoint_dir.mkdir(exist_ok=True)
        locks.enter_context(held(config.checkpoint_dir, shared=False))


@contextlib.contextmanager
def held(folder: Path, *, shared: bool) -> Iterator[None]:
    """folder/.lock held (exclusive, or shared) while inside; removed on the way out when no
    other process holds it. Held elsewhere: a one-line UserError."""
    path = folder / LOCK
    file = lock(path, shared=shared)
    try:
        yield
    finally:
        if file is not None:
            # Removed only under an exclusive hold: other folds may share it, still training.
            with contextlib.suppress(OSError):
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                path.unlink(missing_ok=True)
            file.close()


def lock(path: Path, *, shared: bool) -> IO | None:
    """The open lock file at `path`, locked; None where the file system cannot lock."""
    while True:
        created = not path.exists()
        file = path.open("a")
        try:
            fcntl.flock(file, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as error:
            file.close()
            if error.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise UserError(
                    f"{path.parent}: in use by another process (a run training there); wait "
                    "for it to end, or choose another --run-id"
                ) from None
            if created:  # held by nothing, it would outlive the run; one found is not ours
                path.unlink(missing_ok=True)
            # E.g. Lustre mounted without flock: go on unlocked, as before there was a lock.
            logging.getLogger("train").warning(
                "%s: cannot lock (%s): a second start in this run folder is not noticed.",
                path, error.strerror,
            )  # fmt: skip
            return None
        if is_same_file(file, path):
            return file
        file.close()  # removed by a run that ended meanwhile: lock the file there now


def is_same_file(file: IO, path: Path) -> bool:
    """The open `file` is still the one at `path` (not removed, nor replaced)."""
    try:
        here, there = os.fstat(file.fileno()), path.stat()
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)

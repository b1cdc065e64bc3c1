"""The run's timeline: which checkpoint a run folder resumes from, and what a restart from an
earlier checkpoint sets aside.

A run folder holds one timeline: checkpoints that each continue the one saved before, all with
the same timeline id. `latest` names its head and that id. Restarting from an earlier checkpoint
starts a new timeline there: the checkpoints after it, and the best models of their epochs, move
to abandoned/<time>/, where they are kept and never chosen again. So -r RUN_FOLDER,
trainer.auto_resume and elastic restarts always continue the timeline the run is on.
"""

import logging
import secrets
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from utils.state.checkpoint import (
    BEST_NAME,
    CheckpointError,
    checkpoint_order,
    load_checkpoint,
    read_latest,
    sorted_checkpoints,
    state_order,
    write_atomic,
    write_latest,
)
from utils.state.sharded import check_shards, move_with_shards, referenced_folders

ABANDONED = "abandoned"  # <run folder>/abandoned/<time>/: the files of timelines left behind


def new_timeline_id() -> str:
    return secrets.token_hex(4)


@dataclass(frozen=True)
class ResumePoint:
    """Where a run starts: a checkpoint (None: epoch 1 of a new run) and its timeline."""

    path: Path | None
    timeline: str  # the id of the timeline the run continues, or starts
    # Started at a checkpoint that was not its timeline's head: what followed it (in the
    # checkpoints, and in the trackers' runs) belongs to another history.
    new_timeline: bool = False
    # Checkpoints after `path` (a timeline left behind, unreadable ones): moved to abandoned/
    # once the resume is accepted.
    set_aside: tuple[Path, ...] = ()
    # Another run's checkpoint (-r CKPT -c CONFIG): a new run starts from its weights.
    fine_tune: bool = False


def timeline_of(state: dict) -> str | None:
    return (state.get("timeline") or {}).get("id")


def readable_timeline(path: Path) -> str | None:
    """The timeline id of a checkpoint file, None when it cannot be read."""
    try:
        return timeline_of(load_checkpoint(path, mmap=True))
    except CheckpointError:
        return None


def choose(run_dir: Path, logger: logging.Logger) -> ResumePoint | None:
    """The newest checkpoint of the run folder's timeline that loads; None when it has none.

    The chain is `latest`'s checkpoint and what was saved after it on the same timeline (a crash
    between a save and the update of `latest`), or without `latest`, every checkpoint. An
    unreadable one is warned about and the one before it is taken. Reads only.
    """
    ordered = sorted_checkpoints(run_dir)
    head, timeline = read_latest(run_dir)
    if head is None:
        chain, later = ordered, []
    else:
        after = ordered[ordered.index(head) + 1 :]
        chain = ordered[: ordered.index(head) + 1]
        chain += [path for path in after if timeline and readable_timeline(path) == timeline]
        later = [path for path in after if path not in chain]
    damaged = []
    for path in reversed(chain):
        try:
            state = load_checkpoint(path, mmap=True)
            check_shards(state, path)  # a sharded checkpoint's folder must load too
        except CheckpointError as error:
            logger.warning("%s; resuming from the checkpoint before it.", error)
            damaged.append(path)
            continue
        # `latest` names the current timeline: its head may be where it branched off another.
        own = timeline or timeline_of(state) or new_timeline_id()
        return ResumePoint(path, own, set_aside=tuple(sorted([*later, *damaged])))
    if damaged:
        raise CheckpointError(
            f"{run_dir}: none of its {len(damaged)} checkpoint(s) can be read (see the warnings "
            "above); resume from a copy, or start a new run"
        )
    return None


def from_file(path: Path, *, same_run: bool) -> ResumePoint:
    """A checkpoint named with -r. In its own run, the checkpoints after it are set aside, and
    unless they were another timeline's anyway, it starts a new timeline."""
    state = load_checkpoint(path, mmap=True)  # unreadable: a one-line error, nothing touched
    check_shards(state, path)
    own = timeline_of(state)
    if not same_run:  # fine-tuning: a new run, its folder is not touched
        return ResumePoint(path, new_timeline_id(), new_timeline=True, fine_tune=True)
    # model_best.pth, or a checkpoint renamed: its place in the run is what it holds.
    order = checkpoint_order(path) or state_order(state)
    later = [other for other in sorted_checkpoints(path.parent) if checkpoint_order(other) > order]
    head, _ = read_latest(path.parent)
    replaced = (head is not None and head != path) or any(
        own is not None and readable_timeline(other) == own for other in later
    )
    if not later or not replaced:
        return ResumePoint(path, own or new_timeline_id(), set_aside=tuple(later))
    return ResumePoint(path, new_timeline_id(), new_timeline=True, set_aside=tuple(later))


def best_epoch(path: Path) -> int | None:
    """The epoch of a model_best*.pth: in its name, or read from it; None when unreadable."""
    match = BEST_NAME.fullmatch(path.name)
    if match and match.group(1):
        return int(match.group(1))
    try:
        return int(load_checkpoint(path, mmap=True)["epoch"])
    except CheckpointError:
        return None


def set_aside(run_dir: Path, point: ResumePoint, logger: logging.Logger) -> Path | None:
    """Make `point` the head of the run folder's timeline: `latest` names it first (so that a
    crash from here on resumes it), then the checkpoints after it and the best models of later
    epochs move to abandoned/<time>/. model_best.pth is then rebuilt from its best epoch's
    checkpoint when one is left. Returns the folder they went to (None: nothing to move)."""
    if point.path is None or not point.set_aside:
        return None
    state = load_checkpoint(point.path, mmap=True)
    write_latest(run_dir, point.path, point.timeline)
    moved = [path for path in point.set_aside if path.exists()]
    for path in sorted(run_dir.glob("model_best*.pth")):
        epoch = best_epoch(path)
        if BEST_NAME.fullmatch(path.name) and (epoch is None or epoch > state["epoch"]):
            moved.append(path)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = run_dir / ABANDONED / f"{stamp}-{secrets.token_hex(2)}"
    folder.mkdir(parents=True)
    staying = referenced_folders(run_dir, excluding=moved)
    for path in moved:  # with its shards folder (a sharded checkpoint)
        move_with_shards(path, folder, staying)
    logger.warning(
        "Continuing from %s: %d later file(s) of the run (%s) set aside in %s; they are kept, "
        "and never resumed.",
        point.path.name,
        len(moved),
        ", ".join(path.name for path in moved),
        folder,
    )
    restore_best(run_dir, state.get("monitor") or {}, logger)
    return folder


def restore_best(run_dir: Path, monitor: dict, logger: logging.Logger) -> None:
    """model_best.pth again, a copy of the checkpoint of the monitor's best epoch."""
    best = run_dir / "model_best.pth"
    epoch = monitor.get("best_epoch")
    if best.exists() or epoch is None:
        return
    for source in (
        run_dir / f"checkpoint-epoch{epoch}.pth",
        run_dir / f"model_best-epoch{epoch}.pth",
    ):
        if source.is_file():
            with source.open("rb") as file:
                write_atomic(best, lambda target, file=file: shutil.copyfileobj(file, target))
            logger.info("model_best.pth: epoch %d again (%s).", epoch, source.name)
            return
    logger.warning(
        "model_best.pth: the best epoch so far (%d) has no checkpoint left; an epoch that "
        "improves on it writes one.",
        epoch,
    )

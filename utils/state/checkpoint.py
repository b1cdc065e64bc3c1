"""Atomic writes, checkpoint names, and safe, validated reads."""

import os
import pickle
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import torch

from utils.util import UserError, describe_error

LATEST = "latest"  # a file in the run folder naming the head of the run's timeline
# checkpoint-epoch<E>.pth: epoch E done; checkpoint-epoch<E>-step<S>.pth: inside epoch E, at
# optimizer step S. Global steps only grow along a run, so the names sort in the order they were
# written, whatever the batch size each part of the run trained with.
CHECKPOINT_NAME = re.compile(r"checkpoint-epoch(\d+)(?:-step(\d+))?\.pth")
BEST_NAME = re.compile(r"model_best(?:-epoch(\d+))?\.pth")
# What write_atomic leaves behind when the process dies inside it: .<name>.<random>.tmp
TEMPORARY_NAME = re.compile(r"\..+\.[0-9a-f]{16}\.tmp")
# Keys every checkpoint written by this template has; a file without them is someone else's.
REQUIRED_KEYS = ("model", "config", "epoch")


class CheckpointError(UserError):
    """A checkpoint file that is missing, unreadable, unsafe or not ours."""


def write_atomic(path: Path, write: Callable[[BinaryIO], None], *, durable: bool = True) -> None:
    """Replace `path` with what `write` puts in a file, in one step: a crash at any point leaves
    the old file intact and no partial file under the name.

    The bytes go to a temporary file in the same folder (so the rename never crosses
    file systems), are flushed and fsynced, and only then renamed onto `path`. The file gets the
    mode any new file gets (0644 under umask 022). An OSError is raised as itself, also when
    torch.save wraps it in a RuntimeError. durable False: no fsync (a killed process still
    leaves a whole file; a power cut may not), for small files written often.
    """
    path = Path(path)
    temporary = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    try:
        # os.open with 0o666 lets the umask decide, as open() does; mkstemp would force 0600.
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as error:  # named after the file it was to become
        raise OSError(error.errno, error.strerror, str(path)) from None
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            if durable:
                os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        cause = error.__context__  # torch.save: RuntimeError("unexpected pos ...") from OSError
        if not isinstance(error, OSError) and isinstance(cause, OSError):
            raise cause from None
        raise
    if not durable:
        return
    # Persist the rename itself: without this a power cut can forget the new directory entry.
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_text_atomic(path: Path, text: str, *, durable: bool = True) -> None:
    """Replace `path` with `text` atomically (see write_atomic)."""
    write_atomic(path, lambda file: file.write(text.encode("utf-8")), durable=durable)


def save_checkpoint(state: dict, path: Path) -> None:
    """torch.save `state` to `path` atomically (see write_atomic)."""
    write_atomic(path, lambda file: torch.save(state, file))


def remove_temporaries(folder: Path) -> list[Path]:
    """Delete what write_atomic left in `folder` when a process died inside it; returns them."""
    found = [path for path in folder.iterdir() if TEMPORARY_NAME.fullmatch(path.name)]
    for path in found:
        path.unlink(missing_ok=True)
    return found


def load_checkpoint(
    path: Path, map_location: str | torch.device = "cpu", *, mmap: bool = False
) -> dict:
    """Read a checkpoint with weights_only=True; refuse missing, corrupt, unsafe or foreign files.

    mmap: map the tensors instead of reading them (a cheap check that the file loads: its
    index and every record it names are there).
    """
    path = Path(path)
    if path.is_dir():  # a run folder: test.py and train.py -r choose in it; the others do not
        example = path / "model_best.pth"
        if not example.exists() and (path / "fold-0").is_dir():  # a cross-validation's
            example = path / "fold-0" / "model_best.pth"
        raise CheckpointError(
            f"{path}: a folder, not a checkpoint file; pass a checkpoint in it (e.g. {example})"
        )
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        # weights_only refuses any pickled reference to a Python global (a class, a function),
        # so a payload that would run code is rejected before anything executes.
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        if found:
            raise CheckpointError(
                f"{path}: refused to load: it references the Python object {found.group(1)}, which "
                "weights_only loading does not allow; only load files you trust, and by other means"
            ) from None
        raise CheckpointError(
            f"{path}: not a readable checkpoint (not a torch.save file?)"
        ) from None
    except Exception as error:  # zipfile, EOF and stream errors all mean a damaged file
        raise CheckpointError(
            f"{path}: not a readable checkpoint (truncated or corrupted?): {describe_error(error)}"
        ) from None
    if not isinstance(state, dict) or any(key not in state for key in REQUIRED_KEYS):
        raise CheckpointError(
            f"{path}: not a checkpoint written by this template "
            f"(expected a dict with keys {', '.join(REQUIRED_KEYS)})"
        )
    return state


def ema_weights(state: dict, path: Path) -> dict:
    """The averaged weights (trainer.ema_decay) of a checkpoint, as a model state dict.

    state["ema"] is the state dict of torch.optim.swa_utils.AveragedModel: the averaged
    network's entries under "module.", and its update counter "n_averaged".
    """
    averaged = state.get("ema")
    if not averaged:
        raise CheckpointError(f"{path}: holds no averaged weights (trainer.ema_decay was off)")
    prefix = "module."
    return {key[len(prefix) :]: value for key, value in averaged.items() if key.startswith(prefix)}


def use_averaged_weights(state: dict, requested: str) -> bool:
    """Whether --weights `requested` loads the averaged weights of a checkpoint: "ema" asks for
    them, "trained" for the trained ones, "auto" for those the run's monitor judged (the
    averaged ones when trainer.monitor watched a val/ema_ metric)."""
    if requested == "auto":
        return state.get("weights") == "ema"
    return requested == "ema"


def checkpoint_name(epoch: int, step: int | None = None) -> str:
    """checkpoint-epoch<epoch>.pth, or inside that epoch at a global step, -step<step>."""
    return (
        f"checkpoint-epoch{epoch}.pth"
        if step is None
        else f"checkpoint-epoch{epoch}-step{step}.pth"
    )


def checkpoint_order(path: Path) -> tuple[int, float] | None:
    """(epoch, step) of a checkpoint's name, a complete epoch after every step inside it; None
    for other files."""
    match = CHECKPOINT_NAME.fullmatch(path.name)
    if match is None:
        return None
    step = match.group(2)
    return int(match.group(1)), int(step) if step else float("inf")


def state_order(state: dict) -> tuple[int, float]:
    """(epoch, step) of a checkpoint read from its contents, as checkpoint_order reads its name:
    for model_best.pth and renamed copies."""
    inside = bool((state.get("position") or {}).get("batches") or state.get("resume_batch"))
    return (state["epoch"] + 1, state["global_step"]) if inside else (state["epoch"], float("inf"))


def sorted_checkpoints(checkpoint_dir: Path) -> list[Path]:
    """Periodic and mid-epoch checkpoints, oldest first (model_best.pth is not among them)."""
    found = [(checkpoint_order(path), path) for path in checkpoint_dir.glob("checkpoint-*.pth")]
    return [path for order, path in sorted(item for item in found if item[0] is not None)]


def write_latest(run_dir: Path, path: Path, timeline: str) -> None:
    """Point `latest` at `path`, the head of the timeline `timeline` (its second line)."""
    write_text_atomic(run_dir / LATEST, f"{path.name}\ntimeline {timeline}\n")


def read_latest(run_dir: Path) -> tuple[Path | None, str | None]:
    """(the checkpoint `latest` names, its timeline id); (None, None) when there is no `latest`.

    Only write_latest writes it, naming a file of the run folder, so anything else in it (edited
    by hand) is refused in one line rather than guessed at: a path (`sub/...`, absolute) or a
    missing file would leave the timeline without its head, or resume another run's checkpoint.
    """
    latest = run_dir / LATEST
    fix = "write the name of one of the run's checkpoint-*.pth files in it, or delete it"
    try:
        lines = latest.read_text(encoding="utf-8").splitlines() or [""]
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or "not text"
        raise CheckpointError(f"{latest}: cannot be read ({reason}); {fix}") from None
    name = lines[0].strip()
    if Path(name).name != name or not name:
        raise CheckpointError(f"{latest}: names {name!r}, not a file name in its folder; {fix}")
    if not (run_dir / name).is_file():
        raise CheckpointError(f"{latest}: names {name!r}, which is not in {run_dir}; {fix}")
    timeline = lines[1].partition("timeline ")[2].strip() if len(lines) > 1 else ""
    # A head that is not a checkpoint-*.pth (-r on model_best.pth or a renamed copy) has no
    # place among the named checkpoints: the chain is then every one of them.
    head = run_dir / name if checkpoint_order(Path(name)) is not None else None
    return head, timeline or None

"""Atomic checkpoint writes and safe, validated reads."""

import os
import pickle
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import torch

from utils.util import UserError, describe_error, unwrap_model

LATEST = "latest"  # a file in the run folder naming its newest complete checkpoint
CHECKPOINT_NAME = re.compile(r"checkpoint-epoch(\d+)(?:-batch(\d+))?\.pth")
# Keys every checkpoint written by this template has; a file without them is someone else's.
REQUIRED_KEYS = ("model", "config", "epoch")


class CheckpointError(UserError):
    """A checkpoint file that is missing, unreadable, unsafe or not ours."""


def write_atomic(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Replace `path` with what `write` puts in a file, in one step: a crash at any point leaves
    the old file intact and no partial file under the name.

    The bytes go to a temporary file in the same folder (so the rename never crosses
    file systems), are flushed and fsynced, and only then renamed onto `path`.
    """
    path = Path(path)
    handle, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    # Persist the rename itself: without this a power cut can forget the new directory entry.
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically (see write_atomic)."""
    write_atomic(path, lambda file: file.write(text.encode("utf-8")))


def save_checkpoint(state: dict, path: Path) -> None:
    """torch.save `state` to `path` atomically (see write_atomic)."""
    write_atomic(path, lambda file: torch.save(state, file))


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint with weights_only=True; refuse missing, corrupt, unsafe or foreign files."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
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


def load_model_state(model: torch.nn.Module, state: dict, path: Path, *, ema: bool = False) -> None:
    """Load state["model"] (or with ema, the averaged weights) into `model` (unwrapped from
    DDP); a mismatch is a CheckpointError."""
    model = unwrap_model(model)
    try:
        model.load_state_dict(ema_weights(state, path) if ema else state["model"])
    except RuntimeError as error:
        detail = " ".join(str(error).split())[:300]
        arch = state["config"].get("arch", {}).get("type", "?")
        raise CheckpointError(
            f"{path}: its weights (arch {arch}) do not fit the configured model: {detail}"
        ) from None


def sorted_checkpoints(checkpoint_dir: Path) -> list[Path]:
    """Periodic and mid-epoch checkpoints, oldest first (model_best.pth is not among them)."""
    found = []
    for path in checkpoint_dir.glob("checkpoint-epoch*.pth"):
        match = CHECKPOINT_NAME.fullmatch(path.name)
        if match:
            epoch, batch = int(match.group(1)), match.group(2)
            # A complete epoch e sorts after every mid-epoch checkpoint of epoch e.
            found.append(((epoch, int(batch) if batch else float("inf")), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint of a run folder (periodic or mid-epoch), or None.

    Every checkpoint file is complete (saves are atomic), so the newest by name is the one to
    resume from even when a crash came between saving it and updating the `latest` file.
    """
    found = sorted_checkpoints(run_dir)
    return found[-1] if found else None

"""Sharded checkpoints (distributed.strategy "fsdp"): the model's and the optimizer's tensors in
a torch.distributed.checkpoint (DCP) folder, each rank writing its own shards, beside the
checkpoint file (rank 0's torch.save of everything else) that names it under "sharded".

The checkpoint file is written last, atomically: it is the commit. A kill at any point before
leaves a folder no checkpoint names, which the next save or start deletes (collect_garbage);
a folder is deleted only when no checkpoint in its run folder names it, so model_best.pth and
checkpoint-epoch<N>.pth of one epoch share one. Reads are safe as torch.load(weights_only=True)
is: DCP unpickles its .metadata file, so ours admits only DCP's own metadata classes, and
refuses pickled (non-tensor) entries, which DCP would load with weights_only=False.
"""

import contextlib
import pickle
import secrets
import shutil
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import get_state_dict

from utils.distributed.process_group import broadcast_object
from utils.state.checkpoint import CheckpointError, load_checkpoint
from utils.util import describe_error, unwrap_model

KEY = "sharded"  # in a checkpoint file: the name of its DCP folder, beside it
FOLDER_GLOB = "shards-*.dcp"
# What DCP's .metadata pickle may name: its own dataclasses, torch's dtypes and sizes, paths.
SAFE_MODULES = ("torch.distributed.checkpoint.metadata",)
SAFE_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
}


class ShardsError(CheckpointError):
    """A sharded checkpoint whose folder is missing, damaged or unsafe."""


class MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if module in SAFE_MODULES or (module, name) in SAFE_GLOBALS or dtype:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


class SafeReader(dcp.FileSystemReader):
    """DCP's file reader, with the metadata read by MetadataUnpickler and checked to hold
    tensors only (the shards themselves DCP reads with torch.load(weights_only=True))."""

    def read_metadata(self, *args: object, **kwargs: object) -> Metadata:
        path = Path(self.path) / ".metadata"
        try:
            with path.open("rb") as file:
                metadata = MetadataUnpickler(file).load()
        except FileNotFoundError:
            raise ShardsError(f"{self.path}: no .metadata: a save cut short") from None
        except pickle.UnpicklingError as error:
            raise ShardsError(
                f"{path}: refused to load: it references the Python object {error}, which a DCP "
                "checkpoint's metadata never does"
            ) from None
        except Exception as error:  # EOF, a damaged stream
            raise ShardsError(f"{path}: unreadable ({describe_error(error)})") from None
        if not isinstance(metadata, Metadata):
            raise ShardsError(f"{path}: not DCP metadata")
        pickled = [
            name
            for name, entry in metadata.state_dict_metadata.items()
            if isinstance(entry, BytesStorageMetadata)
        ]
        if pickled:
            raise ShardsError(f"{path}: refused to load: {pickled[0]} is a pickled object")
        if getattr(metadata, "storage_meta", None) is None:  # as DCP's own reader does
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


@contextlib.contextmanager
def single_process_quietly() -> Iterator[None]:
    """DCP warns at every save and load without a process group that it assumes one process:
    that is what this template means there (no torchrun)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def shards_folder(state: dict, path: Path) -> Path | None:
    """The DCP folder of the checkpoint `path` (whose contents are `state`); None: not sharded."""
    name = state.get(KEY)
    return None if name is None else Path(path).parent / name


def check_shards(state: dict, path: Path) -> None:
    """Refuse a sharded checkpoint whose folder is gone, its metadata unreadable or unsafe, or a
    shard file shorter than the metadata says (a copy cut short, a full disk): found before a
    resume chooses it, as load_checkpoint's mmap finds a truncated checkpoint file."""
    folder = shards_folder(state, path)
    if folder is None:
        return
    if not folder.is_dir():
        raise ShardsError(f"{path}: its shards folder {folder.name} is missing")
    ends: dict[str, int] = {}  # shard file -> where its last record ends
    for info in SafeReader(folder).read_metadata().storage_data.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        try:
            size = (folder / name).stat().st_size
        except OSError:
            raise ShardsError(f"{path}: its shard file {folder.name}/{name} is missing") from None
        if size < end:
            raise ShardsError(
                f"{path}: its shard file {folder.name}/{name} is truncated ({size} of {end} bytes)"
            )


@contextlib.contextmanager
def dcp_errors() -> Iterator[None]:
    """DCP reports a failure as a CheckpointException holding every failed rank's error, and
    it derives from BaseException, which no `except Exception` catches: raise the lowest
    failed rank's own error instead (an OSError stays one: a full disk)."""
    try:
        yield
    except CheckpointException as error:
        if not error.failures:
            raise RuntimeError(" ".join(str(error).split())) from None
        raise error.failures[min(error.failures)][0] from None


def wait_for_shards(future: Future) -> None:
    """The end of a background write (write_shards), its error as dcp_errors raises it."""
    with dcp_errors():
        future.result()


# --- writing ---------------------------------------------------------------------------


def split_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(the tensors a DCP folder holds: the model's and each parameter's optimizer state, by
    parameter name, sharded as they are; the rest of the optimizer state: its param_groups and
    any non-tensor per-parameter values, for the checkpoint file)."""
    model_state, optimizer_state = get_state_dict(unwrap_model(model), optimizer)
    tensors, extra = {}, {}
    for name, values in optimizer_state["state"].items():
        tensors[name] = {k: v for k, v in values.items() if isinstance(v, torch.Tensor)}
        extra[name] = {k: v for k, v in values.items() if not isinstance(v, torch.Tensor)}
    rest = {"param_groups": optimizer_state["param_groups"], "extra": extra}
    return {"model": model_state, "optimizer": tensors}, rest


def write_shards(
    checkpoint_dir: Path,
    shards: dict,
    global_step: int,
    *,
    background: dist.ProcessGroup | bool = False,
) -> tuple[str, Future | None]:
    """Every rank writes its shards to a new folder of checkpoint_dir (a collective); returns its
    name, the same on every rank, and with `background` the future of the write: the shards
    are copied first (DCP's staging), then written by a thread, whose collectives go through
    `background`, a gloo group of their own (True in one process, without a process group).
    DCP writes the folder's .metadata last."""
    name = broadcast_object(f"shards-step{global_step}-{secrets.token_hex(4)}.dcp")
    writer = dcp.FileSystemWriter(checkpoint_dir / name)
    with single_process_quietly(), dcp_errors():  # one process without a process group
        if background is False:
            dcp.save(shards, storage_writer=writer)
            return name, None
        group = None if background is True else background
        saving = dcp.async_save(shards, storage_writer=writer, process_group=group)
        return name, getattr(saving, "upload_completion", saving)  # newer torch: a response


def checkpoint_group() -> dist.ProcessGroup | bool:
    """The gloo group background saves coordinate through (made once per run, by every rank
    together); True without a process group."""
    return dist.new_group(backend="gloo") if dist.is_initialized() else True


def referenced_folders(checkpoint_dir: Path, excluding: list[Path] = ()) -> set[str]:
    """The shards folders that the checkpoint files of checkpoint_dir (but `excluding`) name."""
    names = set()
    for path in checkpoint_dir.glob("*.pth"):
        if path in excluding:
            continue
        try:
            names.add(load_checkpoint(path, mmap=True).get(KEY))
        except CheckpointError:
            continue
    return names


def collect_garbage(checkpoint_dir: Path) -> list[str]:
    """Delete the shards folders no checkpoint file names (a save cut short, checkpoints
    dropped by keep_last); returns their names. Rank 0 only."""
    folders = list(checkpoint_dir.glob(FOLDER_GLOB))
    if not folders:
        return []
    keep = referenced_folders(checkpoint_dir)
    removed = [folder.name for folder in folders if folder.name not in keep]
    for name in removed:
        shutil.rmtree(checkpoint_dir / name, ignore_errors=True)
    return removed


def move_with_shards(path: Path, destination: Path, staying: set[str]) -> None:
    """Move checkpoint `path` into folder `destination` with its shards folder: moved when no
    checkpoint that stays names it (`staying`), else copied (hard links where possible)."""
    try:
        folder = shards_folder(load_checkpoint(path, mmap=True), path)
    except CheckpointError:  # a damaged file: moved as it is
        folder = None
    path.rename(destination / path.name)
    if folder is None or not folder.is_dir() or (destination / folder.name).exists():
        return
    if folder.name in staying:
        shutil.copytree(folder, destination / folder.name, copy_function=_link_or_copy)
    else:
        folder.rename(destination / folder.name)


def _link_or_copy(source: str, target: str) -> None:
    try:
        Path(target).hardlink_to(source)
    except OSError:
        shutil.copy2(source, target)


# --- reading ---------------------------------------------------------------------------


def load_shards(template: dict, folder: Path, *, partial: bool = False) -> None:
    """DCP-load `folder` into `template` in place (resharded to this run's ranks)."""
    try:
        with single_process_quietly(), dcp_errors():
            dcp.load(
                template,
                storage_reader=SafeReader(folder),
                planner=dcp.DefaultLoadPlanner(allow_partial_load=partial),
            )
    except ShardsError:
        raise
    except Exception as error:  # e.g. a shard file damaged inside
        detail = " ".join(describe_error(error).split())[:300]
        raise ShardsError(f"{folder}: cannot load its shards: {detail}") from None

"""Decoded splits for the device pipeline: any dataset of images decoded once into one uint8
tensor, and ImageFolderDataLoader's cache of it, one tensor file per split folder and size,
reused until the folder's files change."""

import hashlib
import logging
import os
import time
from pathlib import Path

import PIL
import torch
import torchvision
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets
from torchvision.transforms import v2

from base.base_data_loader import TransformedDataset
from utils import describe_error
from utils.state.checkpoint import save_checkpoint

# Part of every fingerprint: a change to what the files hold (layout, dtype, resizing) bumps it.
# 2: 16-bit grey images scaled to 8 bits, no longer clipped; 3: turned upright by EXIF Orientation.
CACHE_VERSION = 3
# A temporary cache file untouched this long was left by a process killed while writing it.
ABANDONED_AFTER_S = 3600


def decoder_versions() -> str:
    """The releases of what decodes and resizes (PIL, torch, torchvision), without a build tag
    such as "+cu130": a new one may change pixels, so a cache written under another is not the
    decode the DataLoader path now makes, which the device pipeline promises bit for bit."""
    versions = (PIL.__version__, torch.__version__, torchvision.__version__)
    return " ".join(str(version).split("+")[0] for version in versions)


def decode_split(
    dataset: Dataset, size: int, *, num_workers: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (image, label) of `dataset` as (uint8 (N, C, size, size), int64 labels (N,)): each
    image through v2.ToImage and v2.Resize((size, size), antialias=True), the first steps of the
    cifar preset, decoded by `num_workers` worker processes (a damaged file raises the
    dataset's own error, e.g. load_image's DataError naming it)."""
    resize = v2.Compose([v2.ToImage(), v2.Resize((size, size), antialias=True)])
    # A generator of its own: without one, iterating draws the workers' seed from torch's global
    # generator, and a run that decodes would start from other weights than one that finds the
    # cache. Nothing here is random.
    loader = DataLoader(
        TransformedDataset(dataset, resize),
        batch_size=256,
        num_workers=num_workers,
        generator=torch.Generator(),
    )
    images, labels = [], []
    for batch_images, batch_labels in loader:
        images.append(batch_images.as_subclass(torch.Tensor))
        labels.append(batch_labels)
    if not images:
        return torch.empty(0, 3, size, size, dtype=torch.uint8), torch.empty(0, dtype=torch.int64)
    return torch.cat(images), torch.cat(labels).to(torch.int64)


def cache_path(dataset: datasets.ImageFolder, size: int, cache_dir: Path) -> Path:
    """<cache_dir>/<split folder>-<size>px-<folder hash>-<fingerprint>.pt. The fingerprint hashes
    the format version, the library versions, the size, the classes and every file's path
    (relative to the split folder), size, modification time, inode and status-change time: a
    changed, added or removed file makes a new one. The folder hash (of its absolute path) tells apart data folders that
    share a cache_dir."""
    folder = Path(dataset.root)
    folder_hash = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:8]
    versions = f"version {CACHE_VERSION} {decoder_versions()}\nsize {size}\n"
    digest = hashlib.sha256(versions.encode())
    digest.update(("\0".join(dataset.classes) + "\n").encode())
    for path, _ in dataset.samples:
        stat = os.stat(path)
        # Size and mtime alone miss a file rewritten with its mtime put back (cp -p, rsync -t,
        # tar x): writing or replacing a file always moves its ctime (which no tool can set
        # back) or its inode. A chmod moves ctime too: a needless decode, never a stale one.
        key = (stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns)
        digest.update(f"{Path(path).relative_to(folder)}\0{key}\n".encode())
    return cache_dir / f"{folder.name}-{size}px-{folder_hash}-{digest.hexdigest()[:24]}.pt"


def load_cached(path: Path) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(images, labels) saved at `path`, or None when there is none (or it cannot be read)."""
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, weights_only=True, map_location="cpu")
        images, labels = saved["images"], saved["labels"]
    except Exception as error:  # a damaged file: decoded again, and replaced
        logging.getLogger("data").warning(
            "Decoded-image cache %s unreadable (%s): decoding again.", path, describe_error(error)
        )
        return None
    logging.getLogger("data").info("Decoded images: reusing %s (%d images).", path, len(labels))
    return images, labels


def decode_and_cache(
    dataset: datasets.ImageFolder, size: int, path: Path, *, num_workers: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode `dataset` at `size` and save it at `path` (atomically: a temporary file, then a
    rename), removing the files an older version of that folder left there. A folder that
    cannot be written is a warning: the decoded images are then used without a cache."""
    logger = logging.getLogger("data")
    started = time.perf_counter()
    images, labels = decode_split(dataset, size, num_workers=num_workers)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A temporary file of its own name (processes on other machines may be writing the same
        # cache), fsynced, renamed: a crash never leaves a partial cache under its name.
        save_checkpoint({"images": images, "labels": labels}, path)
    except (OSError, RuntimeError) as error:
        logger.warning(
            "Cannot write the decoded-image cache %s (%s): the images are decoded again on every "
            "run; set data_loader.args.cache_dir to a writable folder.",
            path,
            getattr(error, "strerror", None) or describe_error(error),
        )
        return images, labels
    prefix = path.name.rsplit("-", 1)[0]  # <split folder>-<size>px-<folder hash>
    for stale in path.parent.glob(f"{prefix}-*.pt"):
        if stale != path:
            stale.unlink(missing_ok=True)
    # What a process killed while writing left (write_atomic's hidden temporaries, as large as
    # the cache). Only old ones: a fresh one may be another process's write in progress.
    for left in path.parent.glob(f".{prefix}-*.pt.*.tmp"):
        if time.time() - left.stat().st_mtime > ABANDONED_AFTER_S:
            left.unlink(missing_ok=True)
    logger.info(
        "Decoded images: cached %d images of %s in %s (%.1f s).",
        len(labels),
        dataset.root,
        path,
        time.perf_counter() - started,
    )
    return images, labels

"""Image files as the loaders and predict.py read them: which files in a folder are images
(VisibleImageFolder), and each file as 8-bit RGB, upright as an image viewer shows it
(load_image), with a segmentation mask turned the same way (read_mask)."""

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import ExifTags, Image, ImageOps
from torchvision import datasets
from torchvision.transforms import v2

from base.base_data_loader import DataError
from utils import describe_error
from utils.util import IMAGE_EXTENSIONS, warn_unread_images


class VisibleImageFolder(datasets.ImageFolder):
    """ImageFolder without hidden entries: class folders and files whose names start with "."
    (.ipynb_checkpoints, macOS's ._<name> beside each copied file: not images) are not data."""

    def __init__(self, root: str | os.PathLike, **kwargs: Any) -> None:
        super().__init__(root, is_valid_file=visible_image, **kwargs)

    def make_dataset(  # ImageFolder's is a staticmethod; called on the instance all the same
        self,
        directory: str | os.PathLike,
        class_to_idx: dict[str, int],
        extensions: tuple[str, ...] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> list[tuple[str, int]]:
        """ImageFolder's (path, class) samples, and a warning counting the image files of a
        format not read (.heic...), which are left out, as the files that are not images are."""
        left_out: list[str] = []

        def valid(path: str) -> bool:
            if visible_image(path):
                return True
            left_out.append(path)
            return False

        try:
            return super().make_dataset(
                directory, class_to_idx, is_valid_file=valid, allow_empty=allow_empty
            )
        finally:  # also before ImageFolder's error for a class folder that holds none it reads
            warn_unread_images(directory, left_out, logging.getLogger("data"))

    def find_classes(self, directory: str | os.PathLike) -> tuple[list[str], dict[str, int]]:
        classes = [name for name in super().find_classes(directory)[0] if name[0] != "."]
        if not classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
        return classes, {name: index for index, name in enumerate(classes)}


def visible_image(path: str) -> bool:
    """An image file by its extension (ImageFolder's, and .jfif), and not a hidden file."""
    name = os.path.basename(path)
    return name[0] != "." and name.lower().endswith(IMAGE_EXTENSIONS)


def exif_orientation(image: Image.Image) -> int:
    """The image's EXIF Orientation (1 to 8; 1, also when it has none: upright as stored), as PIL's
    ImageOps.exif_transpose reads it."""
    return image.getexif().get(ExifTags.Base.Orientation, 1)


def load_image(path: str) -> Image.Image:
    """An image file as 8-bit RGB (ImageFolder's loader), upright as an image viewer shows it (its
    EXIF Orientation applied), a file PIL cannot read reported as a DataError naming it."""
    return read_image(path)[0]


def read_image(path: str) -> tuple[Image.Image, int]:
    """load_image's image, and the EXIF Orientation (1 to 8) it was turned by."""
    try:
        with open(path, "rb") as file:
            image = Image.open(file)
            # A phone stores a portrait photo sideways and tags how to turn it for display.
            orientation = exif_orientation(image)
            ImageOps.exif_transpose(image, in_place=True)
            return eight_bit(image).convert("RGB"), orientation
    # PIL reports a broken file as OSError (also UnidentifiedImageError, "image file is
    # truncated"), SyntaxError or ValueError, depending on the format and the damage.
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise DataError(
            f"{path}: unreadable image ({describe_error(error)}); replace or remove it"
        ) from None


def read_mask(path: str | os.PathLike, orientation: int, *, image_path: str) -> np.ndarray:
    """A mask file's pixels as stored (class indices, not converted), turned by its EXIF
    Orientation, which must be its image's (`orientation`): a tag on one of the two alone leaves
    unknown which way round the mask was drawn. A file PIL cannot read is a DataError naming it."""
    try:
        with Image.open(path) as mask:
            if exif_orientation(mask) != orientation:
                raise DataError(
                    f"{image_path}: EXIF Orientation {orientation}, but {exif_orientation(mask)} "
                    f"in its mask {path}; save both the same way round (ImageOps.exif_transpose "
                    "turns one upright)"
                )
            ImageOps.exif_transpose(mask, in_place=True)
            return np.asarray(mask)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:  # as above
        raise DataError(f"{path}: unreadable mask ({describe_error(error)}); replace it") from None


def eight_bit(image: Image.Image) -> Image.Image:
    """A 16-bit grey image (mode "I;16...", or "I", read as 16-bit) scaled to 8 bits: PIL's own
    conversion to RGB clips its values at 255, which makes it nearly all white. Floating-point
    pixels, and 32-bit integers past 16 bits, whose range is not known, are refused."""
    if image.mode == "F":
        raise ValueError("floating-point pixels of unknown range; save it with 8 or 16 bits")
    if not image.mode.startswith("I"):
        return image
    values = np.asarray(image.convert("I"))  # (H, W) int32
    # Clipped to 16 bits, a 32-bit image's brighter pixels would all read as white.
    if values.size and (values.min() < 0 or values.max() > 65535):
        raise ValueError(
            f"32-bit integer pixels from {values.min()} to {values.max()}, past 16 bits "
            "(0 to 65535); save it with 8 or 16 bits"
        )
    return Image.fromarray(((values + 128) // 257).astype(np.uint8))


def load_image_tensor(path: str) -> torch.Tensor:
    """load_image's image as a (C, H, W) uint8 tensor."""
    return v2.functional.pil_to_tensor(load_image(path))


def one_size(
    folder: Path, paths: list[Path], other_way: str = "", *, upright: bool = False
) -> tuple[int, int]:
    """The (width, height) of every image of a split; several sizes are refused, naming two (and
    `other_way` out): a batch stacks them (else an error at the first batch that mixes them,
    maybe an epoch in). Reads the headers alone; `upright`: the sizes after the EXIF Orientation
    (load_image's), else as stored (detection's images)."""
    sizes: dict[tuple[int, int], str] = {}  # (width, height): the first image of that size
    for path in paths:
        with Image.open(path) as image:
            width, height = image.size
            if upright and exif_orientation(image) >= 5:  # a quarter turn: the sides swap
                width, height = height, width
        sizes.setdefault((width, height), path.name)
    if len(sizes) > 1:
        (first, name), (other, other_name) = list(sizes.items())[:2]
        raise DataError(
            f"{folder}: images of several sizes ({name} is {first[0]} x {first[1]}, "
            f"{other_name} {other[0]} x {other[1]}); a batch stacks them: give every image "
            f"of a split one size{other_way}"
        )
    return next(iter(sizes))

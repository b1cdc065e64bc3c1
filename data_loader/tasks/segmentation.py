"""Semantic segmentation from PNG folders: an image and a mask of class indices per sample.

On disk (write_segmentation writes this; a user's data looks the same):
    <data_dir>/classes.json               ["background", "disk", ...]: class i is pixel value i
    <data_dir>/<split>/images/<name>.png  RGB, any size (one per split, unless batch_size 1)
    <data_dir>/<split>/masks/<name>.png   one channel (mode "L"), same name and size
for split in train, val, test. Named in configs as data_loader.type "SegmentationDataLoader".
"""

import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, default_collate
from torchvision import tv_tensors
from torchvision.transforms import v2

from base import BaseDataLoader
from data_loader.image_files import load_image, one_size, read_image, read_mask
from utils import ConfigValueError
from utils.evaluation.predictions import image_paths
from utils.state.checkpoint import write_atomic
from utils.util import DataError, warn_unread_images

# The pixel statistics of write_segmentation's images, roughly: inputs near N(0, 1).
MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
SHAPES = ("disk", "square", "triangle")


class MaskFolder(Dataset):
    """(RGB PIL image, mask (H, W) int64) pairs of <root>/images/*.png and <root>/masks/*.png
    (.PNG too; hidden files are not data), matched by file name, sorted."""

    def __init__(self, root: Path) -> None:
        self.root = root
        files = list((root / "images").glob("*"))
        warn_unread_images(root / "images", files, logging.getLogger("data"), read=(".png",))
        pngs = [path for path in files if path.suffix.lower() == ".png"]
        images = sorted(path for path in pngs if not path.name.startswith("."))
        if not images:
            raise DataError(
                f"{root / 'images'}: no PNG images (see data_loader/tasks/segmentation.py)"
            )
        missing = [path.name for path in images if not (root / "masks" / path.name).is_file()]
        if missing:
            raise DataError(
                f"{root / 'masks'}: no mask for image {missing[0]} (and {len(missing) - 1} more)"
            )
        # (image, mask) paths: sample_ids (the run's data fingerprint) names both files.
        self.samples = [(str(path), f"masks/{path.name}") for path in images]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Image.Image, torch.Tensor]:
        image_path, mask_name = self.samples[index]
        image, orientation = read_image(image_path)  # upright, as an image viewer shows it
        mask = read_mask(self.root / mask_name, orientation, image_path=image_path)
        if mask.ndim != 2 or mask.shape != (image.height, image.width):
            raise DataError(
                f"{self.root / mask_name}: a mask must be one channel of the image's size "
                f"({image.height}, {image.width}); it is {mask.shape}"
            )
        return image, torch.from_numpy(mask.astype(np.int64))  # (H, W) class indices


class SegmentationDataLoader(BaseDataLoader):
    """Images and their masks from PNG folders (see the module's docstring). Training flips an
    image and its mask together (pair_transform); class names come from `class_names` or
    <data_dir>/classes.json; mask pixels equal to ignore_index are no class (not counted)."""

    splits = ("train", "val", "test")
    mean, std = MEAN, STD
    # export.py: the names of the graph's input and output, and the dims besides the batch that
    # may vary (the U-Net is fully convolutional: any height and width its stride divides).
    input_names = ("images",)
    output_names = ("logits",)
    dynamic_dims: ClassVar[dict[int, str]] = {2: "height", 3: "width"}

    def __init__(
        self,
        data_dir: str,
        *,
        class_names: list[str] | None = None,
        flip: bool = True,
        ignore_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(flip, bool):  # "false", a string, would flip
            raise ConfigValueError(f"flip: must be true or false, got {flip!r}")
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, int | None):
            raise ConfigValueError(
                f"ignore_index: must be an integer or null, got {ignore_index!r}"
            )
        self.data_dir, self.flip, self.ignore_index = Path(data_dir), flip, ignore_index
        if class_names is not None and not (
            isinstance(class_names, list) and all(isinstance(name, str) for name in class_names)
        ):
            raise ConfigValueError(f"class_names must be a list of strings, got {class_names!r}")
        self.names = class_names

    def load_split(self, split: str) -> Dataset:
        folder = MaskFolder(self.data_dir / split)
        if self.batch_size > 1:  # refused now, not at the first batch that mixes sizes
            paths = [Path(image) for image, _ in folder.samples]
            other_way = ", or set data_loader.args.batch_size to 1"
            one_size(folder.root / "images", paths, other_way, upright=True)
        return folder

    def location(self, split: str) -> str:
        return str(self.data_dir / split)

    def transform(self, augment: bool) -> Callable:
        """Image -> (3, H, W) float32, normalised; the evaluation transform (no augmentation)."""
        return image_transform()

    def pair_transform(self, augment: bool) -> Callable[[Any, Any], tuple[Any, Any]] | None:
        """Training: (image, mask) flipped together, from the per-sample seeded generator."""
        return JointFlips() if augment and self.flip else None

    def collate(self, split: str) -> Callable:
        return functools.partial(stack_pairs, location=self.location(split))

    def class_names(self) -> list[str]:
        if self.names is not None:
            return list(self.names)
        path = self.data_dir / "classes.json"
        try:
            names = json.loads(path.read_text(encoding="utf-8-sig"))  # any locale, a BOM
        except (OSError, ValueError) as error:
            raise DataError(
                f"{path}: cannot read the class names ({error}); write a JSON list of names, or "
                "set data_loader.args.class_names"
            ) from None
        if not (isinstance(names, list) and all(isinstance(name, str) for name in names)):
            raise DataError(f"{path}: must be a JSON list of class names")
        return names

    @classmethod
    def read_inputs(
        cls, path: Path, args: dict, feature_names: list[str] | None
    ) -> tuple[list[str], list[torch.Tensor]]:
        """predict.py: the image `path`, those in folder `path` or those a glob matches (as
        predict.py finds them for a classifier: every image extension, sorted), each as the
        model's input (3, H, W); images of any size (a list, not a stacked batch)."""
        files = image_paths([str(path)])
        transform, inputs = image_transform(), []
        for file in files:
            inputs.append(transform(load_image(str(file))))  # an unreadable one: a DataError
        return [str(file) for file in files], inputs

    @classmethod
    def example_inputs(cls, args: dict, model: torch.nn.Module, batch_size: int) -> torch.Tensor:
        """export.py: random normalised images (B, 3, S, S), S = 32 or 4 x the U-Net's stride:
        its parity check halves S, and torch.export takes no size whose deepest level is 1."""
        size = max(32, 4 * getattr(model, "stride", 1))
        generator = torch.Generator().manual_seed(0)
        return torch.randn(batch_size, 3, size, size, generator=generator)

    @classmethod
    def prediction_files(cls, name: str) -> list[str]:
        """predict.py: the files prediction_rows writes in --out-dir for the input `name` (its
        mask, named by the image's stem), checked by predict.py before anything is written."""
        return [f"{Path(name).stem}.png"]

    @classmethod
    def prediction_rows(
        cls,
        names: list[str],
        outputs: torch.Tensor,
        *,
        class_names: list[str],
        out_dir: Path | None,
    ) -> list[dict]:
        """predict.py: per image, the predicted mask (argmax of the logits (B, C, H, W)) as a PNG
        in out_dir (pixel value = class index), and a row: the image's path, the mask's file and
        each class's share of the pixels."""
        # (B, H, W) class indices: 8-bit PNGs, 16-bit past 256 classes (8 bits would wrap them).
        dtype = np.uint8 if outputs.shape[1] <= 256 else np.uint16
        masks = outputs.argmax(dim=1).numpy().astype(dtype)
        rows = []
        for name, mask in zip(names, masks, strict=True):
            row: dict = {"path": name}
            if out_dir is not None:  # replaces the name (not a file a link there points to)
                (mask_path,) = (out_dir / file for file in cls.prediction_files(name))
                save = functools.partial(Image.fromarray(mask).save, format="PNG")
                write_atomic(mask_path, save, durable=False)  # save(file): the PNG into it
                row["mask"] = str(mask_path)
            shares = np.bincount(mask.reshape(-1), minlength=len(class_names)) / mask.size
            row.update(
                {
                    f"share_{class_name}": round(float(share), 4)
                    for class_name, share in zip(class_names, shares, strict=False)
                }
            )
            rows.append(row)
        return rows


class JointFlips:
    """(PIL image, mask (H, W)) -> (normalised (3, H, W), mask (H, W)), both flipped the same way,
    horizontally and vertically, each with probability 1/2 from torch's CPU generator. A class,
    not a closure: worker processes started by spawn receive it pickled."""

    def __init__(self) -> None:
        # v2 transforms move a tv_tensors.Mask with the image; ToDtype and Normalize, given a
        # single dtype, touch the image alone, so the mask keeps its class indices.
        self.flips = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(), v2.RandomVerticalFlip()])
        self.normalise = image_transform()

    def __call__(self, image: Image.Image, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        image, mask = self.flips(image, tv_tensors.Mask(mask))
        return self.normalise(image), mask.as_subclass(torch.Tensor)


def stack_pairs(samples: list, location: str) -> Any:
    """The collate hook: torch's default_collate, which stacks the images (B, 3, H, W) and masks
    (B, H, W); images of several sizes in one batch are refused, naming them."""
    sizes = sorted({tuple(image.shape[-2:]) for image, _ in samples})
    if len(sizes) > 1:
        named = " and ".join(f"{height} x {width}" for height, width in sizes)
        raise DataError(
            f"{location}: a batch holds images of {named} pixels, but it stacks images of one "
            "size: resize the images to one size, or set data_loader.args.batch_size to 1"
        )
    return default_collate(samples)


def image_transform() -> Callable:
    """RGB image (PIL, any size) -> normalised (3, H, W) float32."""
    return v2.Compose(
        [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    )


def write_segmentation(
    folder: Path | str,
    *,
    sizes: dict[str, int] | None = None,
    image_size: int = 32,
    seed: int = 0,
) -> Path:
    """Write a synthetic segmentation set under `folder` (the layout of the module's docstring):
    per image 1 or 2 shapes (disk, square, triangle; random size, place and colour) on a noisy
    background of another colour; the mask holds each pixel's shape class (0: background).
    Deterministic in seed. sizes: images per split (default train 256, val 64, test 64)."""
    folder = Path(folder)
    sizes = sizes or {"train": 256, "val": 64, "test": 64}
    (folder).mkdir(parents=True, exist_ok=True)
    (folder / "classes.json").write_text(json.dumps(["background", *SHAPES]) + "\n")
    y, x = np.mgrid[0:image_size, 0:image_size].astype(np.float64)
    for split_index, (split, count) in enumerate(sizes.items()):
        rng = np.random.default_rng([seed, split_index])
        for kind in ("images", "masks"):
            (folder / split / kind).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            image, mask = draw_sample(rng, x, y)
            Image.fromarray(image).save(folder / split / "images" / f"{index:05d}.png")
            Image.fromarray(mask).save(folder / split / "masks" / f"{index:05d}.png")
    return folder


def draw_sample(
    rng: np.random.Generator, x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(image (H, W, 3) uint8, mask (H, W) uint8) of one synthetic sample."""
    size = x.shape[0]
    background = rng.uniform(0, 255, size=3)
    image = np.broadcast_to(background, (*x.shape, 3)).copy()
    mask = np.zeros(x.shape, np.uint8)
    for _ in range(rng.integers(1, 3)):
        label = int(rng.integers(len(SHAPES))) + 1
        radius = rng.uniform(0.18, 0.3) * size
        centre_x, centre_y = rng.uniform(radius, size - radius, size=2)
        dx, dy = x - centre_x, y - centre_y
        if label == 1:  # disk
            inside = dx**2 + dy**2 <= radius**2
        elif label == 2:  # square
            inside = np.maximum(np.abs(dx), np.abs(dy)) <= radius * 0.8
        else:  # triangle, apex up
            inside = (dy >= -radius) & (dy <= radius * 0.7) & (np.abs(dx) <= (dy + radius) * 0.6)
        # A colour far from the background's, so every shape is visible.
        colour = (background + rng.uniform(80, 175, size=3)) % 256
        image[inside], mask[inside] = colour, label
    image += rng.normal(0, 12, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8), mask


if __name__ == "__main__":  # python -m data_loader.tasks.segmentation [FOLDER]
    import sys

    target = write_segmentation(sys.argv[1] if len(sys.argv) > 1 else "data/shapes_segmentation")
    print(f"Wrote train/, val/ and test/ (images/*.png, masks/*.png), classes.json in {target}")

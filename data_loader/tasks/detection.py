"""Object detection from files on disk: PNG images and a CSV of boxes per split (configs/detection.json).

The layout write_detection writes, and DetectionDataLoader reads (your own data in this layout
trains as is):

    <data_dir>/train/images/*.png   <data_dir>/train/boxes.csv   (and the same under test/)

boxes.csv has one row per box, `file,label,x1,y1,x2,y2`: the image's file name, its class name
and the box's corners in pixels (x to the right, y down). An image without rows has no boxes.
The images of a split share one size: a batch stacks them.
A sample is (image float (3, H, W) in [0, 1], {"boxes": float32 (N, 4) xyxy, "labels": int64
(N,)}); a batch is (images (B, 3, H, W), a list of B such dicts).
"""

import csv
import hashlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision.transforms import v2

from base import BaseDataLoader
from data_loader.image_files import one_size
from data_loader.synthetic import _shape_mask
from utils import ConfigValueError
from utils.util import DataError

SHAPES = {"disk": 0, "square": 1, "triangle": 2}  # class name: its drawing in synthetic.py
COLUMNS = ["file", "label", "x1", "y1", "x2", "y2"]
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def write_detection(
    folder: Path | str,
    *,
    num_train: int = 400,
    num_test: int = 100,
    image_size: int = 64,
    seed: int = 0,
) -> None:
    """Write the synthetic detection data under `folder`: per split, PNG images of 1-4 shapes
    (disks, squares, triangles) of random size, colour and position on a noisy background, and
    boxes.csv with the tight box of every shape. Deterministic in seed."""
    if image_size < 32:
        raise ConfigValueError(f"image_size must be >= 32, got {image_size}")
    folder, names = Path(folder), list(SHAPES)
    for split_index, (split, count) in enumerate((("train", num_train), ("test", num_test))):
        rng = np.random.default_rng([seed, split_index])
        image_dir = folder / split / "images"
        image_dir.mkdir(parents=True, exist_ok=True)
        y, x = np.mgrid[0:image_size, 0:image_size].astype(np.float64)
        rows = []
        for index in range(count):
            image = rng.uniform(0, 255, size=3) + rng.normal(
                0, 12, size=(image_size, image_size, 3)
            )
            for _ in range(rng.integers(1, 5)):
                label = names[rng.integers(len(names))]
                radius = rng.uniform(5, 12)
                centre_x, centre_y = rng.uniform(radius, image_size - radius, size=2)
                mask = _shape_mask(SHAPES[label], x - centre_x, y - centre_y, radius)
                if not mask.any():
                    continue
                # A colour far from the background's, so that the shape stays visible.
                colour = (image.reshape(-1, 3).mean(axis=0) + 128) % 256
                image[mask] = colour + rng.normal(0, 12, size=3)
                rows_of, cols_of = np.nonzero(mask)  # the tight box: pixels as unit squares
                box = [cols_of.min(), rows_of.min(), cols_of.max() + 1, rows_of.max() + 1]
                rows.append([f"{index:05d}.png", label, *(int(value) for value in box)])
            pixels = np.clip(image, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(image_dir / f"{index:05d}.png")
        with open(folder / split / "boxes.csv", "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(COLUMNS)
            writer.writerows(rows)


def read_boxes(
    path: Path, class_names: list[str] | None, size: tuple[int, int] | None = None
) -> dict[str, list[tuple[str, list]]]:
    """{file name: [(class name, [x1, y1, x2, y2]), ...]} from a boxes.csv; each row checked
    (a known class when class_names is given, x1 < x2 and y1 < y2, inside the images' (width,
    height) when size is given), a bad one refused in one line naming its row."""
    boxes: dict[str, list[tuple[str, list]]] = {}
    width, height = size or (math.inf, math.inf)
    if not path.is_file():
        raise DataError(f"{path}: missing (write_detection writes an example)")
    with open(path, newline="", encoding="utf-8-sig") as file:  # Excel's "CSV UTF-8" has a BOM
        reader = csv.DictReader(file)
        if reader.fieldnames is None or not set(COLUMNS) <= set(reader.fieldnames):
            raise DataError(f"{path}: needs the columns {','.join(COLUMNS)}")
        for line, row in enumerate(reader, start=2):
            try:
                corners = [float(row[key]) for key in ("x1", "y1", "x2", "y2")]
            except ValueError:
                raise DataError(f"{path}, line {line}: corners that are not numbers") from None
            if not (corners[0] < corners[2] and corners[1] < corners[3]):
                raise DataError(f"{path}, line {line}: the box needs x1 < x2 and y1 < y2")
            if min(corners) < 0 or corners[2] > width or corners[3] > height:
                raise DataError(
                    f"{path}, line {line}: the box {row['x1']},{row['y1']},{row['x2']},"
                    f"{row['y2']} is not inside the {width} x {height} image"
                )
            if class_names is not None and row["label"] not in class_names:
                raise DataError(
                    f"{path}, line {line}: class {row['label']!r} is not one of the training "
                    f"data's ({', '.join(class_names)})"
                )
            boxes.setdefault(row["file"], []).append((row["label"], corners))
    corners = [corner for rows in boxes.values() for _, box in rows for corner in box]
    if size is not None and corners and max(corners) <= 1 < max(size):
        raise DataError(
            f"{path}: every corner is within [0, 1] on {size[0]} x {size[1]} images: give them "
            "in pixels, not as fractions of the image"
        )
    return boxes


class BoxImages(Dataset):
    """(PIL image, {"boxes": float32 (N, 4), "labels": int64 (N,)}) of every PNG of a folder."""

    def __init__(self, split_dir: Path, class_names: list[str]) -> None:
        # .PNG too; hidden files (macOS's ._<name>.png beside each copied file) are not data.
        self.paths = sorted(path for path in (split_dir / "images").glob("*") if is_data(path))
        if not self.paths:
            raise DataError(f"{split_dir / 'images'}: no PNG images")
        size = one_size(split_dir / "images", self.paths)
        boxes = read_boxes(split_dir / "boxes.csv", class_names, size)
        unknown = set(boxes) - {path.name for path in self.paths}
        if unknown:
            raise DataError(f"{split_dir / 'boxes.csv'}: boxes of missing image {min(unknown)}")
        self.targets = []
        for path in self.paths:
            rows = boxes.get(path.name, [])
            self.targets.append(
                {
                    "boxes": torch.tensor([box for _, box in rows], dtype=torch.float32).view(
                        -1, 4
                    ),
                    # int64 also for an image without boxes (torch.tensor([]) is float32).
                    "labels": torch.tensor(
                        [class_names.index(name) for name, _ in rows], dtype=torch.int64
                    ),
                }
            )

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Image.Image, dict[str, torch.Tensor]]:
        with Image.open(self.paths[index]) as image:
            # Copies: a step that edits its targets in place (a flip of the boxes) must not edit
            # the data of every later epoch (without worker processes nothing else copies them).
            target = {key: value.clone() for key, value in self.targets[index].items()}
            return image.convert("RGB"), target


def is_data(path: Path, suffixes: tuple[str, ...] = (".png",)) -> bool:
    """An image file by its extension, in any case, and not a hidden file."""
    return path.suffix.lower() in suffixes and not path.name.startswith(".")


def image_transform() -> Callable:
    """PIL image -> float (3, H, W) in [0, 1]: the model's input, in training and predict.py."""
    return v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])


def collate_detection(samples: list[tuple[torch.Tensor, dict]]) -> tuple[torch.Tensor, list[dict]]:
    """(images (B, 3, H, W), B target dicts): the boxes per image differ in number, so the
    targets stay a list rather than a stacked tensor (what default_collate would try)."""
    images, targets = zip(*samples, strict=True)
    return torch.stack(images), list(targets)


class DetectionDataLoader(BaseDataLoader):
    """Images and boxes from <data_dir>/<split>/ (see the module's docstring); the class names
    are the sorted labels of the training boxes."""

    splits = ("train", "test")
    # predict.py and export.py: one input, the images (B, 3, H, W); outputs a list of dicts.
    input_names = ("images",)
    output_names = ("detections",)

    def __init__(self, data_dir: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data_dir = Path(data_dir)
        self._class_names: list[str] | None = None

    def class_names(self) -> list[str]:
        if self._class_names is None:
            path = self.data_dir / "train" / "boxes.csv"
            self._class_names = sorted({name for rows in read_boxes(path, None).values()
                                        for name, _ in rows})  # fmt: skip
        return self._class_names

    def load_split(self, split: str) -> Dataset:
        return BoxImages(self.data_dir / split, self.class_names())

    def location(self, split: str) -> str:
        return str(self.data_dir / split)

    def sample_ids(self, split: str) -> list[str]:
        """Each image's file name and a digest of its boxes and labels (not its pixels): a resume
        refuses a split whose boxes.csv changed, as an image folder's whose labels did."""
        dataset, ids = self.dataset(split), []
        for path, target in zip(dataset.paths, dataset.targets, strict=True):
            boxes = target["boxes"].numpy().tobytes() + target["labels"].numpy().tobytes()
            ids.append(f"{path.name}\0{hashlib.blake2b(boxes, digest_size=8).hexdigest()}")
        return ids

    def transform(self, augment: bool) -> Callable:
        # Not augmented: a flip or crop would have to move the boxes too.
        return image_transform()

    def target_classes(self, target: dict[str, torch.Tensor]) -> np.ndarray:
        """The classes of one image's boxes, int64 (N,): the class counts and the label check."""
        return np.asarray(target["labels"], dtype=np.int64)

    def collate(self, split: str) -> Callable:
        return collate_detection  # the same for every split

    @classmethod
    def read_inputs(
        cls, path: Path, args: dict, feature_names: list[str] | None
    ) -> tuple[list[str], list[torch.Tensor]]:
        """predict.py: the PNG or JPEG image `path`, or those of folder `path`, as the model reads
        them: (their paths, images float (3, H, W) in [0, 1]) of any sizes (fully convolutional)."""
        paths = [path]
        if path.is_dir():
            paths = sorted(item for item in path.iterdir() if is_data(item, IMAGE_SUFFIXES))
        if not paths or not paths[0].is_file():
            raise DataError(f"{path}: no image there (PNG or JPEG)")
        transform = image_transform()
        images = []
        for image_path in paths:
            with Image.open(image_path) as image:
                images.append(transform(image.convert("RGB")))
        return [str(image_path) for image_path in paths], images

    @classmethod
    def example_inputs(cls, args: dict, model: torch.nn.Module, batch_size: int) -> torch.Tensor:
        """export.py: random images (B, 3, 64, 64) in [0, 1]."""
        return torch.rand(batch_size, 3, 64, 64, generator=torch.Generator().manual_seed(0))

    @classmethod
    def prediction_rows(
        cls,
        names: list[str],
        outputs: list[dict[str, torch.Tensor]],
        *,
        class_names: list[str],
        out_dir: Path | None,
    ) -> list[dict]:
        """predict.py's rows: one per detected box (path, label, score, x1, y1, x2, y2), and for
        an image without any a row of its path alone (so that every input is accounted for). A
        label the checkpoint has no name for (an older one without names, a model with more
        classes than its data) is its index, as predict.py gives a classifier's."""
        rows: list[dict] = []
        for name, detections in zip(names, outputs, strict=True):
            boxes = detections["boxes"].tolist()
            scores, labels = detections["scores"].tolist(), detections["labels"].tolist()
            if not boxes:
                rows.append({"path": name})
            for box, score, label in zip(boxes, scores, labels, strict=True):
                corners = dict(
                    zip(("x1", "y1", "x2", "y2"), (round(v, 2) for v in box), strict=True)
                )
                named = class_names[label] if label < len(class_names) else str(label)
                rows.append({"path": name, "label": named, "score": round(score, 4), **corners})
        return rows


if __name__ == "__main__":  # python -m data_loader.tasks.detection [FOLDER]
    import sys

    target = Path(sys.argv[1] if len(sys.argv) > 1 else "data/detection")
    write_detection(target)
    print(f"Wrote train/ and test/ (images/*.png, boxes.csv) in {target}")

"""JPEG decoding on the training device (ImageFolderDataLoader's decode "device").

Worker processes only read the files' bytes. The main process decodes each batch of JPEGs with
torchvision.io.decode_jpeg on the device, turns them upright by their EXIF Orientation (read by
the workers, as PIL reads it), runs the preset's per-image transforms there (crops, flips,
auto_augment), then converts, normalises and randomly erases the batch as a whole. The
random transforms draw from the global torch RNG in the main process, which the engine seeds per
(seed, epoch, rank) and a mid-epoch resume restores: the same draws as the uninterrupted run.
Files that are not JPEGs are decoded by PIL in the workers, as the standard path does.
"""

import contextlib
import io
from collections.abc import Callable, Iterator

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms
from torchvision.io import ImageReadMode, decode_jpeg

from base.base_data_loader import DataError
from data_loader.device_pipeline import Normalise
from data_loader.image_files import exif_orientation
from utils import describe_error
from utils.data.sampler import EpochSampler

JPEG_START = b"\xff\xd8\xff"  # every JPEG file begins with these bytes (SOI, then a marker)

# For each EXIF Orientation, the steps that turn an image (..., H, W) upright: the same as PIL's
# exif_transpose (FLIP_LEFT_RIGHT, ROTATE_180, FLIP_TOP_BOTTOM, TRANSPOSE, ROTATE_270, TRANSVERSE,
# ROTATE_90), for tensors decoded without it (decode_jpeg on CUDA ignores the tag).
UPRIGHT: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    2: lambda image: image.flip(-1),
    3: lambda image: image.flip(-2, -1),
    4: lambda image: image.flip(-2),
    5: lambda image: image.transpose(-2, -1),
    6: lambda image: image.rot90(-1, (-2, -1)),
    7: lambda image: image.flip(-2, -1).transpose(-2, -1),
    8: lambda image: image.rot90(1, (-2, -1)),
}


def turn_upright(image: torch.Tensor, orientation: int) -> torch.Tensor:
    """A decoded image (C, H, W) as stored, turned as its EXIF `orientation` says."""
    step = UPRIGHT.get(orientation)
    return image if step is None else step(image).contiguous()


class EncodedImages(Dataset):
    """(file bytes as a 1-D uint8 tensor, label, index, EXIF orientation) of each (path, label) of
    an ImageFolder; a file that is not a JPEG comes decoded instead, (C, H, W) uint8 by
    `pil_decode`, upright already (orientation 1)."""

    def __init__(self, samples: list[tuple[str, int]], pil_decode: Callable) -> None:
        self.samples, self.pil_decode = samples, pil_decode

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int, int]:
        path, label = self.samples[index]
        try:
            with open(path, "rb") as file:
                data = file.read()
        except OSError as error:
            raise DataError(f"{path}: unreadable image ({describe_error(error)})") from None
        if not data.startswith(JPEG_START):
            return self.pil_decode(path), label, index, 1
        # The tag as PIL reads it (the PIL path's exif_transpose), from the header alone. A
        # file too damaged to read it from fails to decode, and PIL then names it.
        try:
            orientation = exif_orientation(Image.open(io.BytesIO(data)))
        except (OSError, SyntaxError, ValueError):
            orientation = 1
        except Image.DecompressionBombError:
            # A header claiming more pixels than PIL's limit: refused by the PIL path in one
            # line naming the file, so refused here the same way (not a worker's traceback,
            # nor a decode of that many pixels on the device).
            return self.pil_decode(path), label, index, 1
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), label, index, orientation


def collate_encoded(
    items: list[tuple[torch.Tensor, int, int, int]],
) -> tuple[list[torch.Tensor], torch.Tensor, list[int], list[int]]:
    """A batch of EncodedImages items: (list of tensors of different sizes, labels, indices,
    orientations)."""
    data, labels, indices, orientations = zip(*items, strict=True)
    return list(data), torch.tensor(labels, dtype=torch.int64), list(indices), list(orientations)


def erase_randomly(
    images: torch.Tensor,
    probability: float,
    scale: tuple[float, float] = (0.02, 0.33),
    ratio: tuple[float, float] = (0.3, 3.3),
) -> torch.Tensor:
    """RandomErasing(probability, scale, ratio, value=0) of each image of a batch (B, C, H, W), in
    place, with torchvision's own rectangle draws (RandomErasing.get_params, from the global torch
    RNG) but a Python 0 as the fill: the transform copies a fill tensor to the device for every
    image, a host sync on a GPU."""
    for image in images:
        if torch.rand(1) >= probability:
            continue
        top, left, height, width, fill = transforms.RandomErasing.get_params(
            image, scale=scale, ratio=ratio, value=[0]
        )
        if fill is not image:  # get_params returns the image itself when no rectangle fitted
            image[:, top : top + height, left : left + width] = 0
    return images


class DeviceDecodedBatches:
    """Batches of an image folder decoded on `device`: (images float (B, C, H, W) normalised,
    labels int64 (B,)) there. Used by the engine as a DataLoader: .sampler, .batch_size,
    .dataset (the split's per-sample view, for the image grid), len() and iteration."""

    def __init__(
        self,
        files: DataLoader,
        *,
        dataset: Dataset,
        transform: Callable,
        normalise: Normalise,
        random_erasing: float,
        pil_decode: Callable,
    ) -> None:
        self.files, self.dataset, self.transform = files, dataset, transform
        self.normalise, self.random_erasing, self.pil_decode = normalise, random_erasing, pil_decode
        self.device = normalise.mean.device
        # decode_jpeg runs on the CPU and on CUDA; elsewhere (MPS) the CPU decodes.
        self.decoder = self.device if self.device.type == "cuda" else torch.device("cpu")
        self.sampler: EpochSampler = files.sampler
        self.batch_size, self.drop_last = files.batch_size, files.drop_last
        # decode_jpeg on CUDA allocates its outputs on the current stream, then has nvJPEG write
        # them from a stream of its own that does not wait for the current one: memory that
        # kernels queued there still read can be handed out and overwritten
        # (pytorch/vision#9606). Decoding while a side stream is current takes the outputs from
        # that stream's memory, which nothing else uses.
        self.side_stream = torch.cuda.Stream(self.decoder) if self.decoder.type == "cuda" else None

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        samples = self.files.dataset.samples
        for data, labels, indices, orientations in self.files:
            images = self.decode(data, orientations, [samples[index][0] for index in indices])
            # Crops and flips one image at a time: the images differ in size until cropped.
            # Alternating flips come with each index (the sampler's SeededIndex) and follow the
            # transform, as on the PIL path (TransformedDataset).
            transformed = []
            for image, index in zip(images, indices, strict=True):
                image = self.transform(image)
                transformed.append(image.flip(-1) if getattr(index, "flip", None) else image)
            batch = torch.stack(transformed)  # (B, C, H, W)
            batch = self.normalise(batch)
            if self.random_erasing > 0:
                erase_randomly(batch, self.random_erasing)
            yield batch, labels.to(self.device, non_blocking=True)

    def decode(
        self, data: list[torch.Tensor], orientations: list[int], paths: list[str]
    ) -> list[torch.Tensor]:
        """(C, H, W) uint8 images on the device, upright: the JPEGs (1-D bytes) decoded there in
        one call and turned by their EXIF orientation; the others came decoded from the workers."""
        images = list(data)
        jpegs = [position for position, item in enumerate(data) if item.dim() == 1]
        if jpegs:
            with self.on_side_stream():
                try:
                    decoded = decode_jpeg(
                        [data[position] for position in jpegs],
                        mode=ImageReadMode.RGB,
                        device=self.decoder,
                    )
                    decoded = [
                        turn_upright(image, orientations[position])
                        for image, position in zip(decoded, jpegs, strict=True)
                    ]
                except torch.OutOfMemoryError:
                    # A RuntimeError too, but not the files' fault: decoding every image by PIL
                    # instead would hide it behind a run many times slower.
                    raise
                except RuntimeError:  # one file the device decoder cannot read: find it
                    decoded = [
                        self.decode_one(data[position], orientations[position], paths[position])
                        for position in jpegs
                    ]
            self.hand_over(decoded)
            for position, image in zip(jpegs, decoded, strict=True):
                images[position] = image
        return [image.to(self.device, non_blocking=True) for image in images]

    def on_side_stream(self) -> contextlib.AbstractContextManager:
        """The side stream as the current one (CUDA), else nothing."""
        if self.side_stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.side_stream)

    def hand_over(self, images: list[torch.Tensor]) -> None:
        """Order the current stream after the side stream's work, and keep the images' memory
        from being reused before what the current stream queues on them has run."""
        if self.side_stream is None:
            return
        current = torch.cuda.current_stream(self.decoder)
        current.wait_stream(self.side_stream)
        for image in images:
            if image.device.type == "cuda":
                image.record_stream(current)

    def decode_one(self, data: torch.Tensor, orientation: int, path: str) -> torch.Tensor:
        """One JPEG on the device, upright; one it cannot decode (damaged, or e.g. CMYK on some
        decoders) is given to PIL, which reads what it can and names the file when it cannot."""
        try:
            image = decode_jpeg(data, mode=ImageReadMode.RGB, device=self.decoder)
        except torch.OutOfMemoryError:
            raise  # the device's memory, not the file (decode's except above)
        except RuntimeError:
            return self.pil_decode(path)  # upright already, as load_image reads it
        return turn_upright(image, orientation)

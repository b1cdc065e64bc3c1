"""The device-resident input pipeline (data_loader.args.pipeline "device").

A split is held once as uint8 images on the training device (the CPU without a GPU); each batch
is gathered by index and augmented there as a whole batch, the CIFAR recipe's random crop with
padding and horizontal flip, then normalised: no worker processes, no per-sample Python, no
host-device sync per batch. Its order is the EpochSampler's, so samplers, len_epoch, folds,
DDP shards and a mid-epoch resume behave as with a DataLoader.
"""

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.nn import functional
from torch.utils.data import Dataset
from torchvision.transforms import v2

from utils.data.sampler import EpochSampler
from utils.util import derive_seed

PADDING = 4  # the CIFAR recipe's v2.RandomCrop(size, padding=4)


def stack_arrays(
    images: np.ndarray, labels: Sequence[int], size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """HWC uint8 images (N, H, W, C) as (uint8 (N, C, size, size), int64 labels (N,)), resized
    as the cifar preset's v2.Resize((size, size), antialias=True) resizes each one."""
    batch = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).contiguous()
    if batch.shape[-2:] != (size, size):
        batch = v2.functional.resize(batch, [size, size], antialias=True)
    return batch, torch.as_tensor(np.asarray(labels), dtype=torch.int64)


def crop_and_flip(
    images: torch.Tensor,
    generator: torch.Generator,
    padding: int = PADDING,
    *,
    padding_mode: str = "constant",
    flips: torch.Tensor | None = None,
) -> torch.Tensor:
    """v2.RandomCrop(size, padding, padding_mode) then v2.RandomHorizontalFlip() of every image
    of a uint8 batch (B, C, H, W), the offsets and flips drawn per image from `generator` (on
    the batch's device): two gathers for the whole batch, no loop over its images. `flips`
    (B,) bool: these flips instead of random ones (alternating flips; all False: none)."""
    num_images, num_channels, height, width = images.shape
    device = images.device
    # Zero padding, as RandomCrop pads uint8 images (a crop shows up to `padding` black lines),
    # or the image mirrored at its edges ("reflect").
    padded = functional.pad(images, (padding,) * 4, mode=padding_mode)  # (B, C, H+2p, W+2p)
    shape = (num_images, 1)
    top = torch.randint(0, 2 * padding + 1, shape, generator=generator, device=device)
    left = torch.randint(0, 2 * padding + 1, shape, generator=generator, device=device)
    flip = torch.rand(shape, generator=generator, device=device) < 0.5
    if flips is not None:
        flip = flips.view(shape)
    columns = torch.arange(width, device=device)
    rows = top + torch.arange(height, device=device)  # (B, H)
    columns = left + torch.where(flip, columns.flip(0), columns)  # (B, W): reversed when flipped
    # Rows, then columns: two gathers along one dimension each. The rows move as 4-byte words
    # when a padded row is a whole number of them: the same bytes in a quarter of the steps.
    words = padded.view(torch.int32) if padded.shape[-1] % 4 == 0 else padded
    rows = rows.view(num_images, 1, height, 1).expand(-1, num_channels, -1, words.shape[-1])
    picked = words.gather(2, rows).view(torch.uint8)  # (B, C, H, W+2p)
    columns = columns.view(num_images, 1, 1, width).expand(-1, num_channels, height, -1)
    return picked.gather(3, columns)  # (B, C, H, W)


class Normalise:
    """uint8 images (..., C, H, W) -> float32 in [0, 1] -> (x - mean) / std: the arithmetic of
    v2.ToDtype(float32, scale=True) and v2.Normalize, bit for bit, with mean and std copied to
    the device once (v2.Normalize copies them on every call, a host sync on a GPU)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], device: torch.device) -> None:
        self.mean = torch.as_tensor(mean, dtype=torch.float32, device=device).view(-1, 1, 1)
        self.std = torch.as_tensor(std, dtype=torch.float32, device=device).view(-1, 1, 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        # From uint8, a new tensor: the in-place steps below leave `images` as it was.
        scaled = v2.functional.to_dtype(images, torch.float32, scale=True)
        return scaled.sub_(self.mean).div_(self.std)


class DeviceBatches:
    """Batches of a split held on the device, in an EpochSampler's order: what a DataLoader over
    it would yield, (images float (B, C, H, W) normalised, labels int64 (B,)) on the device.

    The engine uses it as a DataLoader: .sampler, .batch_size, .dataset (the split's per-sample
    view, for the image grid), len() and iteration. Augmentation draws from a generator on the
    device seeded per batch by (seed, epoch, pass, rank, batch): a mid-epoch resume, which
    starts the sampler at a later batch, draws exactly what the uninterrupted epoch drew.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        sampler: EpochSampler,
        *,
        dataset: Dataset,
        batch_size: int,
        drop_last: bool,
        augment: bool,
        normalise: Normalise,
        seed: int,
        padding: int = PADDING,
        padding_mode: str = "constant",
        flip: str = "random",
    ) -> None:
        self.images, self.labels = images, labels  # uint8 (N, C, H, W), int64 (N,)
        self.sampler, self.dataset, self.batch_size = sampler, dataset, batch_size
        self.drop_last, self.augment = drop_last, augment
        self.normalise, self.seed = normalise, seed
        self.padding, self.padding_mode, self.flip = padding, padding_mode, flip
        self.generator = torch.Generator(device=images.device)
        # Alternating flips: each sample's flip in even passes (the sampler's), on the device.
        flips = sampler.flips if flip == "alternating" else None
        self.flips = None if flips is None else torch.from_numpy(flips).to(images.device)

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return -(-len(self.sampler) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        sampler = self.sampler
        # This rank's indices of the pass from the sampler's `start`, copied to the device once
        # (as one array: not the sampler's per-sample Python objects).
        order = torch.from_numpy(sampler.pass_indices()).to(self.images.device)
        end = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        first = sampler.start // self.batch_size  # batches of the pass already done (a resume)
        for number, begin in enumerate(range(0, end, self.batch_size), start=first):
            indices = order[begin : begin + self.batch_size]
            images = self.images[indices]  # (B, C, H, W) uint8
            if self.augment:
                parts = (self.seed, sampler.epoch, sampler.pass_index, sampler.rank, number)
                self.generator.manual_seed(derive_seed(*parts))
                flips = None
                if self.flips is not None:  # the sampler's alternating flips
                    flips = self.flips[indices] ^ sampler.flips_odd()
                elif self.flip == "none":
                    flips = torch.zeros(len(indices), dtype=torch.bool, device=indices.device)
                images = crop_and_flip(
                    images,
                    self.generator,
                    self.padding,
                    padding_mode=self.padding_mode,
                    flips=flips,
                )
            yield self.normalise(images), self.labels[indices]

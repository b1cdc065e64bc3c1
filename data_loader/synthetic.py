"""A procedurally drawn, CIFAR-shaped data set whose label is the shape in the picture.

Each 32x32 RGB image shows one of ten shapes at a random position, size and colour on a
random textured background (flat, stripes, checks or noise) with pixel noise on top. The
label is a function of what is drawn, so a CNN can learn it; everything else varies.
Generation is deterministic in (seed, split).
"""

import numpy as np
from torch.utils.data import Dataset

CLASS_NAMES = [
    "disk", "square", "triangle", "plus", "cross", "ring", "hbar", "vbar", "diamond", "frame"
]  # fmt: skip
IMAGE_SIZE = 32


def _shape_mask(label: int, x: np.ndarray, y: np.ndarray, radius: float) -> np.ndarray:
    """Boolean (H, W) mask of shape `label`; x, y are pixel offsets from its centre."""
    ax, ay = np.abs(x), np.abs(y)
    thickness = radius / 3
    if label == 0:  # disk
        return x**2 + y**2 <= radius**2
    if label == 1:  # filled square
        return np.maximum(ax, ay) <= radius * 0.8
    if label == 2:  # triangle, apex up (y grows downwards)
        return (y >= -radius) & (y <= radius * 0.7) & (ax <= (y + radius) * 0.6)
    if label == 3:  # plus
        return ((ax <= thickness) & (ay <= radius)) | ((ay <= thickness) & (ax <= radius))
    if label == 4:  # diagonal cross
        return (np.abs(ax - ay) <= thickness * 0.9) & (np.maximum(ax, ay) <= radius * 0.85)
    if label == 5:  # ring
        distance = np.sqrt(x**2 + y**2)
        return (distance <= radius) & (distance >= radius * 0.55)
    if label == 6:  # horizontal bar
        return (ay <= thickness * 0.9) & (ax <= radius)
    if label == 7:  # vertical bar
        return (ax <= thickness * 0.9) & (ay <= radius)
    if label == 8:  # diamond
        return ax + ay <= radius
    # label 9: hollow square
    edge = np.maximum(ax, ay)
    return (edge <= radius * 0.85) & (edge >= radius * 0.5)


def _background(rng: np.random.Generator, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(H, W, 3) float background: a colour with one of four textures."""
    colour = rng.uniform(0, 255, size=3)
    texture = rng.integers(4)
    if texture == 0:  # flat
        pattern = np.zeros_like(x, dtype=np.float64)
    elif texture == 1:  # stripes at a random angle and period
        angle, period = rng.uniform(0, np.pi), rng.uniform(3, 8)
        pattern = np.sin((x * np.cos(angle) + y * np.sin(angle)) * 2 * np.pi / period)
    elif texture == 2:  # checks
        cell = rng.integers(2, 6)
        pattern = ((x // cell + y // cell) % 2) * 2.0 - 1.0
    else:  # blotchy noise
        pattern = rng.normal(size=x.shape)
    amplitude = rng.uniform(10, 40)
    return colour + amplitude * pattern[..., None] * rng.uniform(0.5, 1.0, size=3)


def generate(num_samples: int, seed: int | list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 32, 32, 3), labels int64 (N,)), deterministic in seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE].astype(np.float64)
    images = np.empty((num_samples, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    labels = rng.integers(len(CLASS_NAMES), size=num_samples)
    for index, label in enumerate(labels):
        image = _background(rng, y, x)
        # Keep the shape clearly visible: its colour differs from the background's mean by a margin.
        background_colour = image.reshape(-1, 3).mean(axis=0)
        colour = rng.uniform(0, 255, size=3)
        while np.linalg.norm(colour - background_colour) < 120:
            colour = rng.uniform(0, 255, size=3)
        radius = rng.uniform(6, 10)
        centre_x, centre_y = rng.uniform(10, 22, size=2)
        mask = _shape_mask(int(label), x - centre_x, y - centre_y, radius)
        image[mask] = colour
        image += rng.normal(0, 8, size=image.shape)
        images[index] = np.clip(image, 0, 255).astype(np.uint8)
    return images, labels


class SyntheticShapes(Dataset):
    """(HWC uint8 image, label) pairs from generate(); no transform of its own."""

    classes = CLASS_NAMES

    def __init__(self, num_samples: int, seed: int | list[int]) -> None:
        self.images, self.labels = generate(num_samples, seed)

    @property
    def targets(self) -> np.ndarray:
        """The labels, under the name torchvision datasets give them."""
        return self.labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return self.images[index], int(self.labels[index])

"""auto_augment with decode "device" (issue 31, item 18): torchvision's policies copy a matrix or
a kernel to the device for each image they shear, translate, rotate or sharpen, a host sync per
image on a GPU. Their device variants (data_loader/device_augment.py) give the same images and
copy nothing once an operation and magnitude has been seen. The "meta" device stands in for
the GPU where a copy is counted as one; on the CPU the same calls are counted."""

from pathlib import Path

import pytest
import torch
from conftest import NUM_EXAMPLES
from hypothesis import given, settings
from hypothesis import strategies as st
from test_image_folder_pipelines import write_images
from torch.overrides import TorchFunctionMode

from data_loader.data_loaders import ImageFolderDataLoader
from data_loader.transforms import AUTO_AUGMENT, augmentation_policy


class HostToDeviceCopies(TorchFunctionMode):
    """Counts the calls that copy host data to the device, were it a GPU: torch.tensor and
    as_tensor given a device, Tensor.to given one for a CPU tensor, and copy_ from a CPU tensor
    into one elsewhere. With the device the CPU they copy nothing, but they are the same calls."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor):
            self.count += kwargs.get("device") is not None
        elif func is torch.Tensor.to and args[0].device.type == "cpu":
            self.count += any(names_a_device(arg) for arg in (*args[1:], *kwargs.values()))
        elif func is torch.Tensor.copy_:
            self.count += args[1].device.type == "cpu" and args[0].device.type != "cpu"
        return func(*args, **kwargs)


def names_a_device(argument: object) -> bool:
    return isinstance(argument, str | torch.device | torch.Tensor)


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_the_device_policies_give_torchvisions_images(num_examples):
    """The same random draws and the same pixels, whatever the policy, image and size."""

    @settings(max_examples=num_examples)
    @given(
        st.sampled_from(AUTO_AUGMENT),
        st.sampled_from(["cifar", "imagenet"]),
        st.integers(0, 2**32 - 1),
        st.integers(3, 40),
        st.integers(3, 40),
    )
    def check(name: str, preset: str, seed: int, height: int, width: int) -> None:
        (policy,) = augmentation_policy(name, preset)
        (on_device,) = augmentation_policy(name, preset, on_device=True)
        images = torch.randint(0, 256, (16, 3, height, width), dtype=torch.uint8)
        outputs = []
        for transform in (policy, on_device):
            torch.manual_seed(seed)
            outputs.append(torch.stack([transform(image) for image in images]))
            outputs.append(torch.rand(()))  # the global RNG left where torchvision leaves it
        assert torch.equal(outputs[0], outputs[2]) and torch.equal(outputs[1], outputs[3])

    check()


def count_copies(transform: object, images: list[torch.Tensor], seed: int) -> int:
    torch.manual_seed(seed)
    with HostToDeviceCopies() as copies:
        for image in images:
            transform(image)
    return copies.count


def decode_on_device(root: Path, auto_augment: str) -> ImageFolderDataLoader:
    args = {"batch_size": 4, "seed": 0, "preset": "imagenet", "image_size": 32}
    return ImageFolderDataLoader(str(root), decode="device", auto_augment=auto_augment, **args)


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_decoded_images_are_augmented_without_copies_to_the_device(tmp_path, num_examples):
    """Replaying a pass's draws copies nothing: only an operation and magnitude not seen before
    does, once (two copies: torchvision's matrix and scale)."""
    root = write_images(tmp_path / "images", {"train": ".jpg"}, count=1)

    @settings(max_examples=num_examples)
    @given(st.sampled_from(AUTO_AUGMENT), st.integers(0, 2**32 - 1))
    def check(name: str, seed: int) -> None:
        transform = decode_on_device(root, name).device_transform(augment=True)
        # Decoded images of several sizes, as JPEGs come, cropped to 32 x 32 by the preset.
        images = [
            torch.zeros(3, 40 + size % 5, 48 - size % 7, dtype=torch.uint8) for size in range(32)
        ]
        (policy,) = transform.transforms[-1:]
        assert count_copies(transform, images, seed) <= 2 * len(policy.sources)
        assert count_copies(transform, images, seed) == 0

    check()


def test_policies_copy_nothing_to_a_device_per_image(tmp_path):
    """The reported case: with images on another device, torchvision's policies copied there
    0.4 to 1.6 times per image (400 images on "meta": TrivialAugmentWide 305 copies,
    RandAugment 651, AutoAugment 169); their device variants, once each draw was seen, none."""
    root = write_images(tmp_path / "images", {"train": ".jpg"}, count=1)
    images = [torch.zeros(3, 40, 40, dtype=torch.uint8, device="meta") for _ in range(24)]
    for name in AUTO_AUGMENT:
        transform = decode_on_device(root, name).device_transform(augment=True)
        count_copies(transform, images, seed=0)  # what each draw copies once
        assert count_copies(transform, images, seed=0) == 0, name

"""torchvision's auto-augment policies for images on the training device (decode "device").

Some of their operations copy a constant to the device per image (torch.tensor(...,
device=...)), a blocking host-to-device copy, i.e. a host sync, on a GPU: 0.4 to 1.6 per image,
depending on the policy. The geometric ones (shears, translations, rotations), through
v2.functional.affine and rotate, copy the image's affine matrix: with the policies'
nearest-neighbour sampling and no fill, every output pixel is one input pixel or 0, so which
one is found once per (operation, magnitude, image size, device), by running torchvision's own
operation on an image whose pixels hold their positions, and every later image is warped by a
gather. Sharpness copies its 3x3 kernel: here the kernel is made on the device once and the
arithmetic is torchvision's. The images are torchvision's, bit for bit, and so are the
policy's random draws.
"""

from typing import Any

import torch
from torch.nn import functional
from torchvision.transforms import v2

GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
# float32 holds every pixel position up to this many pixels exactly.
MAX_PIXELS = 2**24


class WithoutHostCopies:
    """A torchvision auto-augment policy (the class this is mixed into) whose geometric
    operations warp tensors by a gather of pixels and whose Sharpness keeps its kernel on the
    device: the same images, no per-image host sync.

    The first image of each (operation, magnitude, height, width, device) still makes
    torchvision's two copies, which give the map kept for the others: one (H*W,) int32 tensor on
    the device, at most 310 of them per size (TrivialAugmentWide's 31 magnitudes, both signs,
    5 operations), 62 MB at 224 px.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # (operation, magnitude, height, width, device) -> (H*W,) int32: 1 + the position of
        # the input pixel each output pixel takes; 0 for one from outside the image.
        self.sources: dict[tuple, torch.Tensor] = {}
        self.kernels: dict[torch.device, torch.Tensor] = {}  # Sharpness's (3, 3), per device

    def _apply_image_or_video_transform(
        self,
        image: Any,
        transform_id: str,
        magnitude: float,
        interpolation: Any,
        fill: Any,
    ) -> Any:
        # torchvision's hook for one operation of the policy, called with the draws it made.
        apply = super()._apply_image_or_video_transform
        if not (isinstance(image, torch.Tensor) and image.dtype == torch.uint8):
            return apply(image, transform_id, magnitude, interpolation, fill)
        height, width = image.shape[-2:]
        if transform_id in GEOMETRIC and self.gathers(height * width):
            key = (transform_id, magnitude, height, width, image.device)
            if key not in self.sources:
                # torchvision's warp of an image whose pixels hold their positions (1, 2, ...):
                # where each output pixel comes from.
                positions = torch.arange(
                    1, height * width + 1, dtype=torch.float32, device=image.device
                ).view(1, height, width)
                warped = apply(positions, transform_id, magnitude, interpolation, fill)
                self.sources[key] = warped.flatten().to(torch.int32)
            padded = functional.pad(image.flatten(-2), (1, 0))  # (..., C, 1 + H*W): 0 first
            return padded.index_select(-1, self.sources[key]).view(image.shape)
        if transform_id == "Sharpness" and image.dim() in (3, 4) and min(height, width) > 2:
            return self.sharpen(image, 1.0 + magnitude)
        return apply(image, transform_id, magnitude, interpolation, fill)

    def gathers(self, num_pixels: int) -> bool:
        """Whether a gather gives torchvision's warp: nearest-neighbour sampling and no fill
        (the policies' defaults), and pixel positions exact in float32."""
        nearest = self.interpolation in ("nearest", v2.InterpolationMode.NEAREST)
        return nearest and self.fill is None and num_pixels < MAX_PIXELS

    def sharpen(self, image: torch.Tensor, factor: float) -> torch.Tensor:
        """v2.functional.adjust_sharpness of a uint8 image (..., C, H, W), its arithmetic step
        for step: blend with the image blurred by a 3x3 kernel (1s round a 5, over 13), edges
        kept."""
        if image.device not in self.kernels:
            kernel = torch.full((3, 3), 1.0 / 13.0, device=image.device)
            kernel[1, 1].fill_(5.0 / 13.0)  # a kernel on the device: nothing copied
            self.kernels[image.device] = kernel
        num_channels = image.shape[-3]
        kernel = self.kernels[image.device].expand(num_channels, 1, 3, 3)
        output = image.to(torch.float32, copy=True)
        blurred = functional.conv2d(output, kernel, groups=num_channels).round_()
        inner = output[..., 1:-1, 1:-1]  # a view: the blend writes into output
        inner.add_(blurred.sub_(inner), alpha=1.0 - factor)
        return output.clamp_(0, 255).to(torch.uint8)


class DeviceTrivialAugmentWide(WithoutHostCopies, v2.TrivialAugmentWide):
    """v2.TrivialAugmentWide, without per-image host copies (WithoutHostCopies)."""


class DeviceRandAugment(WithoutHostCopies, v2.RandAugment):
    """v2.RandAugment, without per-image host copies (WithoutHostCopies)."""


class DeviceAutoAugment(WithoutHostCopies, v2.AutoAugment):
    """v2.AutoAugment, without per-image host copies (WithoutHostCopies)."""

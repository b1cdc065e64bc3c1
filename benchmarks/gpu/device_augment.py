"""Augmentation with decode "device" (JPEGs decoded on the GPU), through the loader's public
arguments; gpu_check.sh's step "device_augment". Ends with one `figure: ...` line, exit 0 only
when both hold:

  flips: flip "alternating" shows every image once mirrored and once not in any two passes in
         a row. Counted on JPEGs whose left half is bright and right half dark (no crop
         padding, so a view is mirrored exactly when its right half is the brighter): over two
         passes, as many mirrored views as images, with decode "device" as with "pil".
  syncs: auto_augment ("trivialaugment") on the device blocks on the host at most
         --max-syncs-per-batch times a batch (torch's sync debug mode counts them; CUDA only)
         in one of the first --max-passes passes over --sync-images images: the first passes
         also count the copies that fill the policy's maps (steady_syncs_per_batch).

python benchmarks/gpu/device_augment.py --work DIR [--device cuda] [--images 128]
    [--sync-images 512] [--max-passes 12]
"""

import argparse
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as `python benchmarks/gpu/device_augment.py`

from data_loader.data_loaders import ImageFolderDataLoader  # noqa: E402
from utils.data.batches import Loader  # noqa: E402


def write_half_bright_jpegs(root: Path, num_images: int) -> Path:
    """root/train/<a|b>/<n>.jpg: 32x32, the left half bright and the right half dark, noise on
    top so that no two are alike."""
    rng = np.random.default_rng(0)
    for index in range(num_images):
        pixels = np.full((32, 32, 3), 40, dtype=np.int16)
        pixels[:, :16] = 215
        pixels += rng.integers(-25, 26, size=pixels.shape, dtype=np.int16)
        folder = root / "train" / "ab"[index % 2]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{index}.jpg", quality=95)
    return root


def mirrored_views(data: ImageFolderDataLoader, epochs: tuple[int, ...] = (1, 2)) -> int:
    """How many training views over these passes have their right half brighter than the left."""
    loader = data.train_loader()
    mirrored = 0
    for epoch in epochs:
        loader.sampler.set_epoch(epoch)
        for images, _ in loader:  # (B, 3, 32, 32), normalised
            mirrored += int(
                (images[..., 16:].mean((1, 2, 3)) > images[..., :16].mean((1, 2, 3))).sum()
            )
    return mirrored


def syncs_in_pass(loader: Loader, epoch: int) -> int:
    """Host-device syncs in one training pass, counted by torch's sync debug mode (CUDA only)."""
    loader.sampler.set_epoch(epoch)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in loader:
                pass
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    for message in sorted(set(syncs))[:3]:
        print(f"  sync: {message.splitlines()[0][:160]}")
    return len(syncs)


def steady_syncs_per_batch(
    count_pass: Callable[[int], int], num_batches: int, max_syncs: float, max_passes: int
) -> tuple[list[float], bool]:
    """Syncs per batch of each pass (count_pass(epoch)), until one is at most `max_syncs` or
    `max_passes` have run; and whether that one came. The device policies copy on the first
    image of each (operation, magnitude) (data_loader/device_augment.py): TrivialAugmentWide's
    310 geometric pairs take a few thousand images to fill, so early passes count the filling;
    a per-image copy would show in every pass."""
    per_batch = []
    for epoch in range(1, max_passes + 1):
        per_batch.append(count_pass(epoch) / num_batches)
        if per_batch[-1] <= max_syncs:
            return per_batch, True
    return per_batch, False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="the images are written here")
    parser.add_argument("--device", default="cuda", help="default cuda")
    parser.add_argument("--images", type=int, default=128, help="default 128 (an even number)")
    parser.add_argument("--max-syncs-per-batch", type=float, default=1.0, help="default 1")
    parser.add_argument("--sync-images", type=int, default=512, help="default 512")
    parser.add_argument("--max-passes", type=int, default=12, help="default 12")
    args = parser.parse_args(argv)
    root = write_half_bright_jpegs(args.work / "images", args.images)
    common = {"preset": "cifar", "crop_padding": 0, "batch_size": 32, "seed": 0}
    counts = {
        decode: mirrored_views(
            ImageFolderDataLoader(str(root), decode=decode, flip="alternating", device=args.device, **common)
        )
        for decode in ("pil", "device")
    }  # fmt: skip
    figure = (
        f"mirrored views in 2 passes of {args.images} images: decode device {counts['device']}, "
        f"pil {counts['pil']} (expected {args.images})"
    )
    ok = counts["device"] == counts["pil"] == args.images
    if torch.device(args.device).type == "cuda":
        # More images than the flips need: each pass then fills more of the policy's pairs.
        root = write_half_bright_jpegs(args.work / "sync_images", args.sync_images)
        figures = {}
        for policy in (None, "trivialaugment"):
            loader = ImageFolderDataLoader(
                str(root), decode="device", auto_augment=policy, num_workers=2,
                device=args.device, **common,
            ).train_loader()  # fmt: skip
            per_batch, steady = steady_syncs_per_batch(
                lambda epoch: syncs_in_pass(loader, epoch),  # noqa: B023 (called right here)
                len(loader), args.max_syncs_per_batch, args.max_passes,
            )  # fmt: skip
            ok = ok and steady
            figures[policy] = (
                f"{per_batch[-1]:.2f} in pass {len(per_batch)} "
                f"(passes: {', '.join(f'{value:.2f}' for value in per_batch)})"
            )
        figure += (
            f"; syncs per batch of 32 over {args.sync_images} images: trivialaugment "
            f"{figures['trivialaugment']}, without auto_augment {figures[None]}"
        )
    print(f"figure: {figure}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""A copy of an image folder with every image JPEG-encoded once more: what a JPEG pass costs.

The real CIFAR-10 images here are JPEGs (quality 75, chroma at half resolution), the records'
are exact pixels, and there is no exact copy to compare with. What can be measured is the next
pass: each image is encoded again at --quality with 4:2:0 chroma, its 8x8 block grid moved by
--shift pixels (a pass on the same grid would change almost nothing: JPEG is nearly idempotent
there), decoded, and stored as PNG, so that nothing more is lost. Train on the copy and on the
original with the same command: the difference is the cost of one such pass
(docs/recipes.md). Prints the mean PSNR of the copy against the original.

python benchmarks/reencode_jpeg.py SOURCE DESTINATION [--quality 75] [--shift 5]
"""

import argparse
import io
import sys
from pathlib import Path

import numpy as np
from PIL import Image

SUFFIXES = {".jpg", ".jpeg", ".png"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="an image folder, e.g. ../cifar10")
    parser.add_argument("destination", type=Path, help="the copy: the same tree, .png files")
    parser.add_argument("--quality", type=int, default=75, help="JPEG quality, 1-95 (75)")
    parser.add_argument("--shift", type=int, default=5, help="grid offset in pixels, 0-7 (5)")
    args = parser.parse_args(argv)
    if not 1 <= args.quality <= 95:
        parser.error(f"--quality must be in 1..95, got {args.quality}")
    if not 0 <= args.shift <= 7:
        parser.error(f"--shift must be in 0..7, got {args.shift}")
    return args


def reencode(image: np.ndarray, *, quality: int, shift: int) -> np.ndarray:
    """(H, W, 3) uint8 -> (H, W, 3) uint8: encoded with `shift` copies of its first row and
    column in front, so that the 8x8 blocks fall elsewhere, decoded, and cropped back."""
    padded = np.pad(image, ((shift, 0), (shift, 0), (0, 0)), mode="edge")
    buffer = io.BytesIO()
    Image.fromarray(padded).save(buffer, format="JPEG", quality=quality, subsampling=2)
    decoded = np.asarray(Image.open(buffer).convert("RGB"))
    return np.ascontiguousarray(decoded[shift:, shift:])


def psnr(before: np.ndarray, after: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB (infinite for equal images)."""
    mse = np.mean((before.astype(np.float64) - after.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255**2 / mse))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    paths = sorted(p for p in args.source.rglob("*") if p.suffix.lower() in SUFFIXES)
    if not paths:
        print(f"error: no .jpg, .jpeg or .png files under {args.source}", file=sys.stderr)
        return 2
    ratios = []
    for path in paths:
        image = np.asarray(Image.open(path).convert("RGB"))
        copy = reencode(image, quality=args.quality, shift=args.shift)
        ratios.append(psnr(image, copy))
        out = (args.destination / path.relative_to(args.source)).with_suffix(".png")
        out.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(copy).save(out)
    print(
        f"{len(paths)} images re-encoded (quality {args.quality}, grid shifted by {args.shift} "
        f"px) into {args.destination}: mean PSNR {np.mean(ratios):.2f} dB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

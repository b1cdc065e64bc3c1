"""JPEGs decoded on the GPU (decode "device", nvJPEG) against PIL, and how its failures end;
gpu_check.sh's step "device_decode". Ends with one `figure: ...` line, exit 0 only when all hold:

  pixels:    grayscale, CMYK and EXIF-tagged JPEGs (Orientations 1 to 8 of an image taller than
             wide), written here by PIL, decode as the PIL path shows them (ImageOps.exif_transpose,
             then RGB): the same shape, a mean difference under --max-mean levels and none over
             --max-difference (nvJPEG upsamples the colour planes unlike libjpeg-turbo: single
             pixels at colour edges differ), in one batch and one by one.
  truncated: a JPEG cut short, in a batch with whole ones, ends in the one-line DataError naming
             it (PIL's verdict, as on the PIL path), not in a half-grey image.
  memory:    (CUDA only) with the device's memory taken, decoding raises torch.OutOfMemoryError
             and does not hand the images to PIL (which would hide it behind a slower run:
             docs/data.md), and pipeline "device"'s split is refused in its one-line DataError.

Without CUDA it prints why it skipped and exits 0; `--device cpu` runs the first two on the
CPU's decoder (libjpeg-turbo: equal to PIL), as tests/test_gpu_check.py does.

python benchmarks/gpu/device_decode.py --work DIR [--device cuda]
    [--max-mean 3] [--max-difference 40]
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import ExifTags, Image

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as `python benchmarks/gpu/device_decode.py`

from data_loader.data_loaders import ImageFolderDataLoader  # noqa: E402
from data_loader.device_decode import DeviceDecodedBatches, EncodedImages  # noqa: E402
from data_loader.image_files import load_image_tensor  # noqa: E402
from utils.util import DataError, describe_error  # noqa: E402


def smooth_pixels(height: int, width: int, seed: int) -> np.ndarray:
    """(height, width, 3) uint8 of smooth colour: JPEG keeps it well, so decoders agree."""
    coarse = np.random.default_rng(seed).integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC))


def write_jpegs(root: Path) -> dict[str, Path]:
    """{name: path} of the JPEGs checked, under root/train/a/ (an ImageFolder) and, for the
    truncated one, root/broken/: "grayscale" (mode L), "cmyk", "orientation-1" to "-8" (48 x 40
    as stored, tagged as a phone tags a photo it stored sideways) and "truncated"."""
    folder, broken = root / "train" / "a", root / "broken"
    folder.mkdir(parents=True, exist_ok=True)
    broken.mkdir(parents=True, exist_ok=True)
    pixels = smooth_pixels(48, 40, seed=0)
    paths = {"grayscale": folder / "grayscale.jpg", "cmyk": folder / "cmyk.jpg"}
    Image.fromarray(pixels).convert("L").save(paths["grayscale"], quality=90)
    Image.fromarray(pixels).convert("CMYK").save(paths["cmyk"], quality=90)
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[ExifTags.Base.Orientation] = orientation
        path = paths[f"orientation-{orientation}"] = folder / f"orientation-{orientation}.jpg"
        Image.fromarray(pixels).save(path, quality=90, exif=exif)
    whole = paths["orientation-1"].read_bytes()
    paths["truncated"] = broken / "truncated.jpg"
    paths["truncated"].write_bytes(whole[: len(whole) // 2])
    return paths


def device_batches(root: Path, device: str) -> DeviceDecodedBatches:
    """decode "device"'s training batches of root, through the loader's public arguments."""
    data = ImageFolderDataLoader(
        str(root), decode="device", device=device, preset="cifar", batch_size=4, seed=0
    )
    return data.train_loader()


def decode(batches: DeviceDecodedBatches, paths: list[Path]) -> list[torch.Tensor]:
    """The files decoded as a batch is: the bytes and tags as the workers read them, then one
    decode call on the device."""
    items = EncodedImages([(str(path), 0) for path in paths], load_image_tensor)
    data, _, _, orientations = zip(*(items[index] for index in range(len(paths))), strict=True)
    return batches.decode(list(data), list(orientations), [str(path) for path in paths])


def differences(decoded: torch.Tensor, path: Path) -> tuple[float, float]:
    """(mean, max) absolute difference in levels from the PIL path's image; inf when the shapes
    differ (an image turned the wrong way, or grey where PIL gives colour)."""
    expected = load_image_tensor(str(path))
    if decoded.shape != expected.shape:
        return float("inf"), float("inf")
    difference = (decoded.cpu().int() - expected.int()).abs().float()
    return float(difference.mean()), float(difference.max())


def check_pixels(
    batches: DeviceDecodedBatches, paths: dict[str, Path], max_mean: float, max_difference: float
) -> tuple[bool, str]:
    """Every whole JPEG, decoded in one batch and one at a time, against PIL."""
    names = [name for name in paths if name != "truncated"]
    together = decode(batches, [paths[name] for name in names])
    worst: dict[str, tuple[float, float]] = {}
    for name, image in zip(names, together, strict=True):
        alone = decode(batches, [paths[name]])[0]
        both = differences(image, paths[name]), differences(alone, paths[name])
        worst[name] = max(both[0][0], both[1][0]), max(both[0][1], both[1][1])
    failed = [
        name for name, (mean, most) in worst.items() if mean >= max_mean or most > max_difference
    ]
    mean, most = (
        max(value[0] for value in worst.values()),
        max(value[1] for value in worst.values()),
    )
    text = f"{len(names)} JPEGs against PIL: mean difference <= {mean:.2f}, max {most:.0f} levels"
    return not failed, text + (f"; off: {', '.join(failed)}" if failed else "")


def check_truncated(batches: DeviceDecodedBatches, paths: dict[str, Path]) -> tuple[bool, str]:
    """A truncated JPEG in a batch with a whole one: the one-line DataError naming it."""
    try:
        decode(batches, [paths["orientation-1"], paths["truncated"]])
    except DataError as error:
        message = str(error)
        if "\n" not in message and str(paths["truncated"]) in message:
            return True, "truncated: one-line DataError naming it"
        return False, f"truncated: DataError {message[:150]!r}"
    return False, "truncated: decoded without an error (the PIL path refuses it)"


def take_memory(device: torch.device) -> list[torch.Tensor]:
    """Tensors holding all of the device's memory but less than a MiB: a real out-of-memory
    next, for torch's allocator and for nvJPEG's own."""
    blocks, size = [], 2**30
    while size >= 2**20:
        try:
            blocks.append(torch.empty(size, dtype=torch.uint8, device=device))
        except torch.OutOfMemoryError:
            size //= 4
    return blocks


def check_memory(root: Path, device: str) -> tuple[bool, str]:
    """With the device full: decoding a large JPEG, and pipeline "device"'s split."""
    large = root / "large.jpg"
    Image.fromarray(smooth_pixels(2048, 2048, seed=1)).save(large, quality=90)
    batches = device_batches(root, device)
    decode(batches, [root / "train" / "a" / "cmyk.jpg"])  # the decoder started, as in training
    handed_to_pil = []
    pil_decode = batches.pil_decode
    batches.pil_decode = lambda path: handed_to_pil.append(path) or pil_decode(path)
    split = ImageFolderDataLoader(str(root), pipeline="device", device=device, preset="cifar",
                                  batch_size=4, seed=0)  # fmt: skip
    blocks = take_memory(torch.device(device))
    try:
        try:
            decode(batches, [large])
            decoded = "decoded the large JPEG with the memory full"
        except torch.OutOfMemoryError as error:
            decoded = f"torch.OutOfMemoryError ({describe_error(error)[:80]})"
        try:
            split.device_split("train", 32)
            refused = "split moved to the device with the memory full"
        except DataError as error:
            refused = "one-line DataError" if "\n" not in str(error) else repr(str(error)[:150])
    finally:
        del blocks
        torch.cuda.empty_cache()
    ok = decoded.startswith("torch.OutOfMemoryError") and not handed_to_pil
    ok = ok and refused == "one-line DataError"
    pil = f", handed {len(handed_to_pil)} to PIL" if handed_to_pil else ""
    return ok, f"memory full: decode {decoded}{pil}; device_split {refused}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="the JPEGs are written here")
    parser.add_argument("--device", default="cuda", help="default cuda")
    parser.add_argument("--max-mean", type=float, default=3.0, help="levels; default 3")
    parser.add_argument("--max-difference", type=float, default=40.0, help="levels; default 40")
    args = parser.parse_args(argv)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print("figure: skipped: no CUDA device here (torch.cuda.is_available() is False)")
        return 0
    paths = write_jpegs(args.work / "images")
    batches = device_batches(args.work / "images", args.device)
    results = [
        check_pixels(batches, paths, args.max_mean, args.max_difference),
        check_truncated(batches, paths),
    ]
    if torch.device(args.device).type == "cuda":
        results.append(check_memory(args.work / "images", args.device))
    print("figure: " + "; ".join(text for _, text in results))
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Input pipeline alone (no model): samples/s of each data path, batches ending on the device.

What is measured: one full training pass (epoch 2 onwards, so that persistent worker processes
are already up) of SyntheticDataLoader's CIFAR-size data (3x32x32 uint8, the CIFAR recipe's
crop with padding, flip and normalisation) through two paths:
  dataloader: the transform per sample in a torch DataLoader with --num-workers processes
              (persistent, pinned memory on CUDA), each batch copied to the device;
  device:     pipeline "device", the split held on the device, gathered and augmented there a
              batch at a time.
With --jpeg-images N, also N generated 224 px JPEGs in an image folder through the imagenet
preset (RandomResizedCrop + flip) with decode "pil" (PIL in the workers) and decode "device"
(decode_jpeg and the transforms on the device). Rounds alternate the paths, so that load from
other processes hits all of them alike; printed is each path's median rate and its ratio to the
first path of its data. On CUDA every pass ends with a synchronize, so device work is counted.
With --min-ratio R, the last line is `figure: ...` and the exit status 1 when pipeline "device"
is less than R times as fast as the DataLoader, or (with --jpeg-images and --min-decode-ratio D)
decode "device" less than D times as fast as PIL (gpu_check.sh's step "device_pipeline").

python benchmarks/input_pipeline.py [--device cuda] [--jpeg-images 2000] [--threads 1] [--quick]
    [--min-ratio R] [--min-decode-ratio D]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as `python benchmarks/input_pipeline.py`

from data_loader.data_loaders import ImageFolderDataLoader, SyntheticDataLoader  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--batch-size", type=int, default=512, help="default 512")
    parser.add_argument(
        "--num-images", type=int, default=10000, help="CIFAR-size images per pass (default 10000)"
    )
    parser.add_argument("--num-workers", type=int, default=2, help="for the DataLoader (2)")
    parser.add_argument("--rounds", type=int, default=3, help="timed passes per path (default 3)")
    parser.add_argument(
        "--jpeg-images", type=int, default=0, help="also decode this many 224 px JPEGs (0: no)"
    )
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's own choice)")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: at most 1024 images, batch 256, 64 JPEGs"
    )
    parser.add_argument(
        "--min-ratio", type=float, help="fail below this ratio of device to DataLoader samples/s"
    )
    parser.add_argument(
        "--min-decode-ratio", type=float, help="with --min-ratio: fail below this decode ratio"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.num_images, args.batch_size = min(args.num_images, 1024), min(args.batch_size, 256)
        args.rounds, args.jpeg_images = 1, min(args.jpeg_images, 64)
    return args


def time_pass(loader: object, epoch: int, device: torch.device) -> float:
    """Seconds of one pass over `loader` (epoch `epoch`), each batch on `device` at the end."""
    loader.sampler.set_epoch(epoch)
    started = time.perf_counter()
    for images, labels in loader:
        images = images.to(device, non_blocking=True)  # a no-op for the device paths
        labels = labels.to(device, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def write_jpegs(folder: Path, num_images: int, size: int = 224) -> None:
    """folder/train/<class>/<n>.jpg: smooth random colour fields, quality 90."""
    rng = np.random.default_rng(0)
    for index in range(num_images):
        coarse = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((size, size), Image.Resampling.BICUBIC)
        class_folder = folder / "train" / f"class{index % 10}"
        class_folder.mkdir(parents=True, exist_ok=True)
        image.save(class_folder / f"{index}.jpg", quality=90)


def measure(
    loaders: dict[str, object], args: argparse.Namespace, device: torch.device
) -> dict[str, float]:
    """Print each loader's median samples/s over the rounds and its ratio to the first; return
    the medians."""
    num_samples = len(next(iter(loaders.values())).sampler)
    for loader in loaders.values():
        time_pass(loader, 1, device)  # the warm-up: worker start, caches, kernels
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    names = list(loaders)
    for round_index in range(args.rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            seconds = time_pass(loaders[name], round_index + 2, device)
            rates[name].append(num_samples / seconds)
    medians = {name: statistics.median(rates[name]) for name in names}
    baseline = medians[names[0]]
    for name in names:
        rate = medians[name]
        spread = f"{min(rates[name]):.0f}-{max(rates[name]):.0f}"
        print(f"  {name:<34} {rate:>10.0f} {rate / baseline:>8.2f}x  {spread}", flush=True)
    return medians


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        # On a busy CPU, threads that wait for each other at every operation cost more than
        # they give: the worker processes run one thread each.
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    workers = {
        "num_workers": args.num_workers,
        "persistent_workers": True,
        "pin_memory": device.type == "cuda",
    }
    common = {"batch_size": args.batch_size, "seed": 0, "device": device}
    print(
        f"torch {torch.__version__} on {device}, {torch.get_num_threads()} threads; batch "
        f"{args.batch_size}, {args.rounds} round(s), {args.num_workers} DataLoader workers",
        flush=True,
    )
    print(f"  {'path':<34} {'samples/s':>10} {'ratio':>9}  min-max", flush=True)
    synthetic = {"num_train": args.num_images, "num_test": 1}
    cifar = measure(
        {
            "CIFAR-size, dataloader": SyntheticDataLoader(
                **common, **synthetic, **workers
            ).train_loader(),
            "CIFAR-size, pipeline device": SyntheticDataLoader(
                **common, **synthetic, pipeline="device"
            ).train_loader(),
        },
        args,
        device,
    )
    if args.jpeg_images:
        with tempfile.TemporaryDirectory() as folder:
            write_jpegs(Path(folder), args.jpeg_images)
            options = {**common, **workers, "preset": "imagenet"}
            jpeg = measure(
                {
                    "224 px JPEG, decode pil": ImageFolderDataLoader(
                        folder, **options
                    ).train_loader(),
                    "224 px JPEG, decode device": ImageFolderDataLoader(
                        folder, decode="device", **options
                    ).train_loader(),
                },
                args,
                device,
            )
    if args.min_ratio is None:
        return 0
    ratio = cifar["CIFAR-size, pipeline device"] / cifar["CIFAR-size, dataloader"]
    figure = f"pipeline device {ratio:.1f}x the DataLoader's samples/s ({args.num_workers} workers)"
    ok = ratio >= args.min_ratio
    if args.jpeg_images and args.min_decode_ratio is not None:
        decode = jpeg["224 px JPEG, decode device"] / jpeg["224 px JPEG, decode pil"]
        figure += f"; decode device {decode:.2f}x PIL's, 224 px JPEGs"
        ok = ok and decode >= args.min_decode_ratio
    print(f"figure: {figure}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The fast CIFAR-10 recipe (configs/cifar10_fast.json), measured on real images.

The shipped config reads torchvision's CIFAR-10 archive (downloaded). This machine has the
50,000 training images as JPEGs instead (../shared/data/cifar10-train/train.tar.gz): the script
unpacks them once outside the repository, runs train.py on the same config with the data loader
switched to ImageFolderDataLoader (preset "cifar"; every other key as shipped, 5,000 of the
images held out for validation), and prints each epoch's validation accuracy and time, read from
the run's metrics.csv. Any other config can be measured the same way (--config config.json).
--out keeps the run's outputs there (else a temporary folder); with --min-accuracy A the last
line is `figure: ...` and the exit status 1 when the last epoch's val/accuracy is below A
(gpu_check.sh's step "cifar_recipe").

python benchmarks/cifar_recipe.py [--config configs/cifar10_fast.json] [--epochs N]
    [--seed S] [--pipeline device|dataloader] [--data ../cifar10] [--archive PATH]
    [--out DIR] [--min-accuracy A] [--set KEY.PATH=VALUE ...]
"""

import argparse
import contextlib
import csv
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT.parent / "shared" / "data" / "cifar10-train" / "train.tar.gz"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/cifar10_fast.json")
    parser.add_argument("--epochs", type=int, help="default: the config's")
    parser.add_argument("--seed", type=int, help="default: the config's")
    parser.add_argument(
        "--pipeline", choices=["device", "dataloader"], help="default: the config's"
    )
    parser.add_argument("--data", type=Path, default=ROOT.parent / "cifar10", help="unpacked here")
    parser.add_argument("--archive", type=Path, default=ARCHIVE)
    parser.add_argument("--out", type=Path, help="outputs here (default: a temporary folder)")
    parser.add_argument("--min-accuracy", type=float, help="fail below this val/accuracy")
    parser.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
    return parser.parse_args(argv)


def unpack(archive: Path, folder: Path) -> Path:
    """folder/train/<class>/*.jpg from the archive, unless it is there already."""
    if not (folder / "train").is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(folder, filter="data")
    return folder


def measured_config(args: argparse.Namespace, out: Path) -> Path:
    """The config with its data read from the unpacked images, its outputs under `out`."""
    config = json.loads((ROOT / args.config).read_text())
    loader = config["data_loader"]
    loader["type"] = "ImageFolderDataLoader"
    loader["args"].pop("download", None)
    loader["args"].update(data_dir=str(args.data), preset="cifar")
    if args.pipeline:
        loader["args"]["pipeline"] = args.pipeline
    if args.epochs:
        config["trainer"]["epochs"] = args.epochs
    if args.seed is not None:
        config["seed"] = args.seed
    config["trainer"].update(save_dir=str(out), loggers=["csv"], save_period=10**6)
    path = out / "config.json"
    path.write_text(json.dumps(config, indent=4))
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (args.data / "train").is_dir() and not args.archive.is_file():
        print(f"error: no images in {args.data} and no archive at {args.archive}", file=sys.stderr)
        return 2
    unpack(args.archive, args.data)
    with contextlib.ExitStack() as stack:
        out = args.out or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        out.mkdir(parents=True, exist_ok=True)
        config = measured_config(args, out)
        extra = [item for pair in args.set for item in ("--set", pair)]
        start = time.perf_counter()
        command = [sys.executable, "train.py", "-c", str(config), "--run-id", "run", *extra]
        result = subprocess.run(command, cwd=ROOT)
        seconds = time.perf_counter() - start
        if result.returncode != 0:
            return result.returncode
        rows = list(csv.DictReader(next(out.glob("log/*/run/metrics.csv")).open()))
    print(f"\n{args.config} ({' '.join(extra) or 'as shipped'}), {seconds:.0f} s in all")
    print("epoch  val/accuracy  seconds  train samples/s")
    for row in rows:
        print(
            f"{row['epoch']:>5}  {float(row['val/accuracy']):12.4f}  "
            f"{float(row['time/epoch_seconds']):7.1f}  {float(row['time/train_samples_per_second']):15.0f}"
        )
    if args.min_accuracy is None:
        return 0
    accuracy = float(rows[-1]["val/accuracy"])
    # The last epoch's model FLOP utilisation, where the device's peak is known (a GPU).
    mfu = rows[-1].get("time/mfu")
    utilisation = f", MFU {100 * float(mfu):.3g} %" if mfu else ""
    print(
        f"figure: val/accuracy {accuracy:.4f} after {len(rows)} epochs, {seconds:.0f} s "
        f"whole process ({sum(float(row['time/epoch_seconds']) for row in rows):.1f} s in epochs)"
        f"{utilisation}",
        flush=True,
    )
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())

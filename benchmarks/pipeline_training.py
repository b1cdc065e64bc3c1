"""End to end: epoch time, data wait and accuracy of training with each input pipeline.

What is measured: train.py with a config's model (default configs/demo.json's CifarCNN) on an
image folder with ImageFolderDataLoader's preset "cifar" (default: the real CIFAR-10 sample,
train/ 2000 and val/ 500 32x32 JPEGs), for --epochs epochs, once per seed and pipeline:
  dataloader: PIL decoding and the per-sample transforms in --num-workers worker processes;
  device:     pipeline "device", the split decoded once into a cache (in a temporary folder,
              before training starts), held on the device and augmented there per batch.
Read back from each run's checkpoints: the epoch time (mean over the epochs after the first),
time/train_samples_per_second and time/data_wait_fraction (the same mean) and val/accuracy
after the last epoch. Printed per pipeline: mean +- sample standard deviation over the seeds,
and the ratio of the mean epoch times. The pipelines alternate, seed by seed, so that load
from other processes hits both alike.

python benchmarks/pipeline_training.py [--epochs 10] [--seeds 0 1 2] [--data-dir DIR]
    [--config config.json] [--n-gpu 1] [--quick]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = ROOT.parent / "shared" / "data" / "cifar10-sample"
PIPELINES = ("dataloader", "device")
# checkpoint metric -> column heading
COLUMNS = {
    "time/epoch_seconds": "epoch s",
    "time/train_samples_per_second": "samples/s",
    "time/data_wait_fraction": "data wait",
    "val/accuracy": "val/accuracy",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/demo.json", help="its model and optimizer")
    parser.add_argument("--data-dir", default=str(SAMPLE_DIR), help="train/<class>/*, val/...")
    parser.add_argument("--epochs", type=int, default=10, help="default 10")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="default 0 1 2")
    parser.add_argument("--batch-size", type=int, default=64, help="default 64 (the demo's)")
    parser.add_argument("--num-workers", type=int, default=2, help="for dataloader (default 2)")
    parser.add_argument("--n-gpu", type=int, default=0, help="0: the CPU (default); 1: a GPU")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 epochs, 1 seed")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.seeds = 2, args.seeds[:1]
    return args


def write_config(args: argparse.Namespace, pipeline: str, seed: int, work_dir: Path) -> Path:
    """args.config trained on args.data_dir with `pipeline`; outputs under work_dir."""
    config = json.loads((ROOT / args.config).read_text())
    config["n_gpu"], config["seed"] = args.n_gpu, seed
    config["arch"]["args"]["num_classes"] = 10
    loader_args = {
        "data_dir": args.data_dir,
        "preset": "cifar",
        "batch_size": args.batch_size,
        "validation_split": 0.0,  # val/ validates
        "num_workers": args.num_workers,
        "persistent_workers": args.num_workers > 0,
        "pin_memory": args.n_gpu > 0,
        "pipeline": pipeline,
        "cache_dir": str(work_dir / "cache"),  # not the data folder: it may be shared
    }
    config["data_loader"] = {"type": "ImageFolderDataLoader", "args": loader_args}
    if config.get("lr_scheduler") and "T_max" in config["lr_scheduler"]["args"]:
        config["lr_scheduler"]["args"]["T_max"] = args.epochs
    config["trainer"].update(
        epochs=args.epochs,
        save_dir=str(work_dir / "saved"),
        save_period=1,
        tensorboard=False,
        verbosity=0,
        early_stop=0,
    )
    path = work_dir / f"{pipeline}-{seed}.json"
    path.write_text(json.dumps(config))
    return path


def run(args: argparse.Namespace, pipeline: str, seed: int, work_dir: Path) -> dict[str, float]:
    """One training run; its metrics (times: mean over the epochs after the first)."""
    config_path = write_config(args, pipeline, seed, work_dir)
    run_id = f"{pipeline}-{seed}"
    command = [sys.executable, "train.py", "-c", str(config_path), "--run-id", run_id]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    if result.returncode != 0:
        sys.exit(f"{run_id} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    name = json.loads(config_path.read_text())["name"]
    run_dir = work_dir / "saved" / "models" / name / run_id
    epochs = [
        torch.load(run_dir / f"checkpoint-epoch{epoch}.pth", weights_only=True)["metrics"]
        for epoch in range(1, args.epochs + 1)
    ]
    timed = epochs[1:] or epochs  # epoch 1 warms up (workers, caches, allocator)
    metrics = {key: statistics.fmean(epoch[key] for epoch in timed) for key in COLUMNS}
    metrics["val/accuracy"] = epochs[-1]["val/accuracy"]
    print(
        f"  {run_id:<14} "
        + "  ".join(f"{COLUMNS[key]} {value:.4g}" for key, value in metrics.items()),
        flush=True,
    )
    return metrics


def spread(values: list[float]) -> str:
    deviation = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.4g} +- {deviation:.2g}"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(
        f"torch {torch.__version__}; {args.config}'s model on {args.data_dir} (preset cifar), "
        f"batch {args.batch_size}, {args.epochs} epochs, seeds {args.seeds}, n_gpu {args.n_gpu}, "
        f"dataloader with {args.num_workers} workers",
        flush=True,
    )
    results: dict[str, list[dict[str, float]]] = {pipeline: [] for pipeline in PIPELINES}
    with tempfile.TemporaryDirectory() as folder:
        for index, seed in enumerate(args.seeds):
            order = PIPELINES if index % 2 == 0 else PIPELINES[::-1]
            for pipeline in order:
                results[pipeline].append(run(args, pipeline, seed, Path(folder)))
    print(f"{'pipeline':<12}" + "".join(f"{heading:>20}" for heading in COLUMNS.values()))
    for pipeline, runs in results.items():
        cells = [spread([metrics[key] for metrics in runs]) for key in COLUMNS]
        print(f"{pipeline:<12}" + "".join(f"{cell:>20}" for cell in cells))
    epoch_seconds = {
        pipeline: statistics.fmean(metrics["time/epoch_seconds"] for metrics in runs)
        for pipeline, runs in results.items()
    }
    print(
        f"epoch time, dataloader / device: {epoch_seconds['dataloader'] / epoch_seconds['device']:.2f}x"
    )


if __name__ == "__main__":
    main()

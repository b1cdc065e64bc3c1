"""Whole-process time of train.py against PyTorch Lightning doing the same work.

The work: configs/demo.json's CifarCNN on real CIFAR-10 JPEGs (ImageFolder, preset "cifar":
crop with padding, flip, normalise), --images of them (default 10,000; 10 % validate), batch
64, Adam lr 0.003 under a per-epoch cosine, --workers DataLoader worker processes, --epochs
epochs, a checkpoint every epoch, TensorBoard, validation every epoch. For Lightning, a
hand-written LightningModule with the same network, transforms, split, loaders and schedule;
Trainer(accelerator=--device, devices=1) with ModelCheckpoint and its TensorBoardLogger. Each
side runs as its own process (start-up included), timed from outside, --rounds times, the first
side alternating; printed: each time, and the ratio train.py / Lightning (below 1: the template
is faster) as the median of the rounds with min and max, saying when their spread is larger
than the effect. With --max-ratio R the last line is `figure: ...` and the exit status 1 when the median
ratio is above R (gpu_check.sh's step "lightning").

Lightning is a benchmark-only optional package (pip install lightning; pyproject.toml's
"benchmarks" extra), not a dependency of the template; the older pytorch-lightning package
(`import pytorch_lightning`) does as well.

python benchmarks/lightning.py [--images 10000] [--epochs 2] [--workers 2] [--rounds 3]
    [--archive ../shared/data/cifar10-train/train.tar.gz] [--device cpu|cuda] [--work DIR]
    [--max-ratio R] [--quick]
"""

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from whole_run import ratio_line, template_config, unpack  # benchmarks/whole_run.py

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT.parent / "shared" / "data" / "cifar10-train" / "train.tar.gz"

LIGHTNING_SCRIPT = """
import sys
import numpy as np
import torch
from torch.utils.data import DataLoader, Subset
from torchvision import datasets

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl

sys.path.insert(0, {root!r})
from data_loader.transforms import cifar_transform  # the same transforms as the template's
from model.model import CifarCNN

data_dir, epochs, workers, out = {data!r}, {epochs}, {workers}, {out!r}


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = CifarCNN(in_shape=[3, 32, 32], num_classes=10, widths=[32, 64, 128],
                              convs_per_block=1, dropout=0.0)

    def training_step(self, batch, index):
        images, labels = batch
        loss = torch.nn.functional.cross_entropy(self.model(images), labels)
        self.log("train/loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, index):
        images, labels = batch
        logits = self.model(images)
        self.log("val/loss", torch.nn.functional.cross_entropy(logits, labels))
        self.log("val/accuracy", (logits.argmax(1) == labels).float().mean())

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=0.003)
        return [optimizer], [torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs)]


torch.manual_seed(0)
train = datasets.ImageFolder(f"{{data_dir}}/train", transform=cifar_transform(True))
val = datasets.ImageFolder(f"{{data_dir}}/train", transform=cifar_transform(False))
order = np.random.default_rng(0).permutation(len(train))
num_val = len(train) // 10
loader = dict(batch_size=64, num_workers=workers, persistent_workers=workers > 0)
train_loader = DataLoader(Subset(train, order[num_val:]), shuffle=True, **loader)
val_loader = DataLoader(Subset(val, order[:num_val]), **loader)
trainer = pl.Trainer(
    max_epochs=epochs, accelerator={accelerator!r}, devices=1, default_root_dir=out,
    callbacks=[pl.callbacks.ModelCheckpoint(every_n_epochs=1, save_top_k=-1)],
    logger=pl.loggers.TensorBoardLogger(out), enable_progress_bar=False,
    log_every_n_steps=10, enable_model_summary=False,
)
trainer.fit(Module(), train_loader, val_loader)
print("val/accuracy", float(trainer.callback_metrics["val/accuracy"]))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archive", default=str(ARCHIVE), help="CIFAR-10 JPEGs, train/<class>/*")
    parser.add_argument("--images", type=int, default=10000, help="default 10,000")
    parser.add_argument("--epochs", type=int, default=2, help="default 2")
    parser.add_argument("--workers", type=int, default=2, help="default 2")
    parser.add_argument("--rounds", type=int, default=3, help="default 3")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="default cpu")
    parser.add_argument("--work", type=Path, help="data and outputs here (default: a new one)")
    parser.add_argument("--max-ratio", type=float, help="fail above this median ratio")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 400 images, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.rounds, args.epochs = 400, 1, 1
    return args


def timed(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{command[1]} failed:\n{result.stderr[-3000:]}")
    return seconds, result.stdout


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not any(importlib.util.find_spec(name) for name in ("lightning", "pytorch_lightning")):
        print("error: needs lightning (a benchmark-only package): pip install lightning")
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="lightning-bench-"))
    data = unpack(Path(args.archive), args.images, work / "data")
    times: dict[str, list[float]] = {"template": [], "lightning": []}
    for round_index in range(args.rounds):
        out = work / f"round{round_index}"
        (out / "lightning").mkdir(parents=True, exist_ok=True)
        config = template_config(data, args, out)
        script = out / "lightning_run.py"
        script.write_text(LIGHTNING_SCRIPT.format(
            root=str(ROOT), data=str(data), epochs=args.epochs, workers=args.workers,
            out=str(out / "lightning"), accelerator="gpu" if args.device == "cuda" else "cpu",
        ))  # fmt: skip
        commands = {
            "template": [sys.executable, "train.py", "-c", str(config), "--run-id", "bench"],
            "lightning": [sys.executable, str(script)],
        }
        # The first side alternates, so that a machine slowing down or warming up hits both.
        for side in list(commands) if round_index % 2 == 0 else list(commands)[::-1]:
            seconds, output = timed(commands[side])
            times[side].append(seconds)
            if side == "lightning":
                accuracy = output.strip().splitlines()[-1]
        print(
            f"round {round_index + 1}: train.py {times['template'][-1]:.1f} s, Lightning "
            f"{times['lightning'][-1]:.1f} s ({accuracy})",
            flush=True,
        )
    ratios = [a / b for a, b in zip(times["template"], times["lightning"], strict=True)]
    median = statistics.median(ratios)
    print(ratio_line(
        f"train.py / Lightning, whole process, {args.images} images, {args.epochs} epochs, "
        f"{args.workers} workers", ratios,
    ))  # fmt: skip
    if args.max_ratio is None:
        return 0
    print(
        f"figure: train.py / Lightning {median:.3f} on {args.device} "
        f"({statistics.median(times['template']):.1f} s vs {statistics.median(times['lightning']):.1f} s)",
        flush=True,
    )
    return 0 if median <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())

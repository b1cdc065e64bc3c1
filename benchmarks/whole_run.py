"""Where a whole train.py process spends its time, beside a hand-written loop doing the same work.

The work: configs/demo.json's CifarCNN (Adam lr 0.003 under a per-epoch cosine, batch 64) on
real CIFAR-10 JPEGs read through ImageFolder with the "cifar" preset (crop with padding, flip,
normalise), --workers DataLoader workers, --epochs epochs, each with validation (accuracy and
top-5), a checkpoint and TensorBoard. --data picks the images:

    cifar10k  the first 10,000 JPEGs of --archive (1,000 a class), 10 % held out (the default)
    sample    ../shared/data/cifar10-sample: its 2,000 training and 500 validation JPEGs
    demo      configs/demo.json as shipped (generated images in memory): train.py alone
    FOLDER    any folder of train/<class>/* (and val/<class>/*, else 10 % of train/ held out)

Each side runs as its own process, in pairs whose first side alternates, timed from outside
(start-up and exit included). Each process also times its phases from inside: train.py through
wrappers this script puts around the trainer's methods before running train.py as __main__, the
hand loop by stopwatches in its code. Printed: each phase side by side (medians over the pairs),
the time to the first training step, and train.py / hand loop for the whole process as the
median, min and max of the pairs, saying when their spread is larger than the effect.

python benchmarks/whole_run.py [--data cifar10k|sample|demo] [--pairs 3] [--epochs 2]
    [--workers 2] [--archive ../shared/data/cifar10-train/train.tar.gz] [--work DIR]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from baselines import hand_loop  # benchmarks/baselines/hand_loop.py

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT.parent / "shared" / "data" / "cifar10-train" / "train.tar.gz"
SAMPLE = ROOT.parent / "shared" / "data" / "cifar10-sample"
PHASES = [
    "imports and config",  # process start to the trainer's build
    "build",  # data, model, optimizer, loggers' packages
    "resume and first-batch check",
    "loggers and data summary",
    "first batch of each epoch",  # worker start-up, the sampler, the first batch
    "steps",
    "waits for data",  # after each epoch's first batch
    "validation",
    "saves",
    "other in the loop",  # epoch lines, the schedule, the monitor
    "closing loggers",
    "end of main",  # after the loop: process group, logging
    "exit",  # the interpreter's own shutdown
    "the rest",  # the whole process's time less the phases above
]


def unpack(archive: Path, images: int, folder: Path) -> Path:
    """The first images / 10 JPEGs of each class of the archive into folder/train/<class>/."""
    per_class: dict[str, int] = {}
    with tarfile.open(archive) as tar:
        for member in tar:
            parts = Path(member.name).parts
            if not member.isfile() or len(parts) != 3:
                continue
            if per_class.get(parts[1], 0) < images // 10:
                per_class[parts[1]] = per_class.get(parts[1], 0) + 1
                tar.extract(member, folder, filter="data")
    return folder


def template_config(data: Path | None, args: argparse.Namespace, out: Path) -> Path:
    """configs/demo.json's model and optimizer on the folder (its val/ when it has one, else 10 %
    of train/ held out), as the other side runs them; data None: the demo as shipped."""
    config = json.loads((ROOT / "configs/demo.json").read_text())
    config["n_gpu"] = int(args.device == "cuda")
    config["trainer"].update(epochs=args.epochs, save_dir=str(out))
    if data is not None:
        held_out = 0.0 if (data / "val").is_dir() else 0.1
        config["data_loader"] = {
            "type": "ImageFolderDataLoader",
            "args": {"data_dir": str(data), "preset": "cifar", "batch_size": 64,
                     "validation_split": held_out, "num_workers": args.workers},
        }  # fmt: skip
    path = out / "config.json"
    path.write_text(json.dumps(config))
    return path


def ratio_line(name: str, ratios: list[float]) -> str:
    """The median of per-pair ratios with min and max, and whether the spread hides the effect."""
    median, low, high = statistics.median(ratios), min(ratios), max(ratios)
    line = f"{name}: median {median:.3f} (min {low:.3f}, max {high:.3f}; {len(ratios)} runs each)"
    if high - low > abs(1 - median):
        line += f"; the spread ({high - low:.3f}) is larger than the effect ({abs(1 - median):.3f})"
    return line


def template_side(config: str, phases_path: str) -> None:
    """train.py run as __main__ with its trainer's methods timed (this process is train.py's)."""
    sys.path.insert(0, str(ROOT))
    import runpy

    import base.base_trainer as base_trainer
    import build
    from logger import Loggers
    from trainer.trainer import Trainer

    seconds: dict[str, float] = {}
    events: dict[str, float] = {}
    epoch_firsts: list[float] = []

    def timed(owner: object, name: str, key: str) -> None:
        function = getattr(owner, name)

        def wrapper(*args: object, **kwargs: object) -> object:
            start = time.time()
            events.setdefault(f"{key} start", start)
            try:
                return function(*args, **kwargs)
            finally:
                seconds[key] = seconds.get(key, 0.0) + time.time() - start
                events[f"{key} end"] = time.time()

        setattr(owner, name, wrapper)

    train_epoch, training_step = Trainer.train_epoch, Trainer.training_step

    def timed_epoch(self: Trainer, epoch: int) -> dict:
        events["epoch start"] = time.time()
        events.pop("first step", None)
        try:
            return train_epoch(self, epoch)
        finally:
            seconds["train_epoch"] = (
                seconds.get("train_epoch", 0.0) + time.time() - events["epoch start"]
            )
            seconds["data waits"] = seconds.get("data waits", 0.0) + self.data_wait_seconds
            epoch_firsts.append(events["first step"] - events["epoch start"])

    def first_step(self: Trainer, batch: object) -> object:
        if "epoch start" in events:
            events.setdefault("first step", time.time())
            events.setdefault("first training step", time.time())
        return training_step(self, batch)

    Trainer.train_epoch, Trainer.training_step = timed_epoch, first_step
    timed(build, "build_trainer", "build")
    for name in ("resume", "check_first_batch", "fit", "validate", "on_train_start"):
        timed(Trainer, name, name)
    for name in ("open_loggers", "save_epoch_end"):
        timed(base_trainer, name, name)
    timed(Loggers, "close", "close")
    sys.argv = ["train.py", "-c", config, "--run-id", "bench"]
    try:
        runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    finally:
        events["main end"] = time.time()
        first_waits = sum(epoch_firsts)
        in_loop = (
            "open_loggers",
            "on_train_start",
            "train_epoch",
            "validate",
            "save_epoch_end",
            "close",
        )
        phases = {
            "build": seconds["build"],
            "resume and first-batch check": seconds["resume"] + seconds["check_first_batch"],
            "loggers and data summary": seconds["open_loggers"] + seconds["on_train_start"],
            "first batch of each epoch": first_waits,
            "steps": seconds["train_epoch"] - max(seconds["data waits"], first_waits),
            "waits for data": max(seconds["data waits"] - first_waits, 0.0),
            "validation": seconds["validate"],
            "saves": seconds["save_epoch_end"],
            "other in the loop": seconds["fit"] - sum(seconds[key] for key in in_loop),
            "closing loggers": seconds["close"],
            "end of main": events["main end"] - events["fit end"],
        }
        Path(phases_path).write_text(json.dumps({
            "phases": phases, "build start": events["build start"],
            "first step": events["first training step"], "main end": events["main end"],
        }))  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", default="cifar10k", help="cifar10k, sample, demo or an image folder"
    )
    parser.add_argument("--pairs", type=int, default=3, help="default 3")
    parser.add_argument("--epochs", type=int, default=2, help="default 2")
    parser.add_argument("--workers", type=int, default=2, help="default 2")
    parser.add_argument(
        "--archive", type=Path, default=ARCHIVE, help="CIFAR-10 JPEGs, train/<class>/*"
    )
    parser.add_argument("--work", type=Path, help="data and outputs here (default: a new folder)")
    parser.add_argument("--side", choices=["template", "hand"], help=argparse.SUPPRESS)  # a child
    parser.add_argument("--child-args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.device = "cpu"
    return args


def run_side(command: list[str], phases_path: Path) -> dict:
    """One process, timed from outside; its phases from inside, completed by the outside times."""
    spawn = time.time()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    end = time.time()
    if result.returncode != 0:
        sys.exit(f"{' '.join(command[1:4])} failed:\n{result.stderr[-3000:]}")
    report = json.loads(phases_path.read_text())
    phases = {**dict.fromkeys(PHASES, 0.0), **report["phases"]}
    phases["imports and config"] = report["build start"] - spawn
    phases["exit"] = end - report["main end"]
    phases["the rest"] = end - spawn - sum(phases.values())
    return {"phases": phases, "first step": report["first step"] - spawn, "total": end - spawn}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.side == "template":
        template_side(*args.child_args)
        return 0
    if args.side == "hand":
        data, epochs, workers, out, phases_path = args.child_args
        hand_loop.main(data, int(epochs), int(workers), out, phases_path)
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="whole-run-"))
    if args.data == "cifar10k":
        data = unpack(args.archive, 10000, work / "data")
    else:  # an image folder of train/<class>/* (and val/<class>/*), or the demo's generated data
        data = {"sample": SAMPLE, "demo": None}.get(args.data, Path(args.data))
    sides = ["template"] if data is None else ["template", "hand"]
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for pair in range(args.pairs):
        for side in sides if pair % 2 == 0 else sides[::-1]:
            out = work / f"{side}{pair}"
            out.mkdir(parents=True, exist_ok=True)
            phases_path = out / "phases.json"
            if side == "template":
                child = [str(template_config(data, args, out)), str(phases_path)]
            else:
                child = [str(data), str(args.epochs), str(args.workers), str(out), str(phases_path)]
            command = [sys.executable, __file__, "--side", side, "--child-args", *child]
            runs[side].append(run_side(command, phases_path))
            print(f"pair {pair + 1}, {side}: {runs[side][-1]['total']:.2f} s", flush=True)
    print(f"\n{'phase (median s)':<30}" + "".join(f"{side:>12}" for side in sides))
    for name in [*PHASES, "first step", "total"]:
        values = [
            statistics.median(
                run["phases"][name] if name in PHASES else run[name] for run in runs[side]
            )
            for side in sides
        ]
        print(f"{name:<30}" + "".join(f"{value:>12.2f}" for value in values))
    if len(sides) == 2:
        ratios = [
            a["total"] / b["total"] for a, b in zip(runs["template"], runs["hand"], strict=True)
        ]
        print(
            ratio_line(
                f"train.py / hand loop, whole process ({args.data}, {args.epochs} epochs)", ratios
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

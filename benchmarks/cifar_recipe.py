"""A CIFAR-10 config (by default config.json, the fast recipe) measured on real images and
reported as the speed records are: accuracy with and without test-time augmentation, over seeds.

The shipped configs read torchvision's CIFAR-10 archive (downloaded); this machine has the 50,000
training images as JPEGs (../shared/data/cifar10-train/train.tar.gz). The script unpacks them once
outside the repository and runs train.py on the config with the data loader switched to
ImageFolderDataLoader (preset "cifar"; every other key as the config has it, --set applied to every
run). By default 5,000 images are held out (the config's validation_split): each epoch logs
val/accuracy with the config's TTA (trainer.tta_flip, tta_translate, tta_translate_weight), and
test.py then scores the final checkpoint on them with TTA off. --full trains on all 50,000 and
test.py scores the final checkpoint on --test-data FOLDER (FOLDER/<class>/<image>), with the
config's TTA and without.

--seeds N trains seeds S..S+N-1 (S: --seed, else the config's), a run each; --compare trains other
configs the same way. It ends with a markdown table: per config the mean over its seeds (with two
or more, the sample std and min-max), seconds per epoch and train.py's whole process. --out keeps
the runs (<out>/<config file name>/seed<S>/; else a temporary folder). With --min-accuracy A the
last line is `figure: ...` and the exit status 1 when the --config's mean final accuracy (with
its TTA) is below A (gpu_check.sh's step "cifar_recipe").

python benchmarks/cifar_recipe.py [--config config.json] [--compare CONFIG [CONFIG ...]]
    [--epochs N] [--seed S] [--seeds N] [--full --test-data FOLDER]
    [--pipeline device|dataloader] [--data ../cifar10] [--archive PATH] [--out DIR]
    [--min-accuracy A] [--set KEY.PATH=VALUE ...]
e.g. python benchmarks/cifar_recipe.py --seeds 2 --compare configs/cifar10_cnn.json
"""

import argparse
import contextlib
import csv
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT.parent / "shared" / "data" / "cifar10-train" / "train.tar.gz"
# test.py's overrides for the final model without TTA. tta_translate_weight back to 1 as well:
# config_checks.check_trainer refuses any other weight once tta_translate is 0.
NO_TTA = ["--set", "trainer.tta_flip=false", "--set", "trainer.tta_translate=0",
          "--set", "trainer.tta_translate_weight=1"]  # fmt: skip


class StepFailed(Exception):
    """train.py or test.py exited with `code`: the script exits with it too."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class Run:
    """One seed of one config, measured."""

    seed: int
    rows: list[dict[str, str]]  # the run's metrics.csv, a row per epoch
    uses_tta: bool
    accuracy: float  # the final model's, with the config's TTA (if any)
    accuracy_no_tta: float  # the same model's without TTA (test.py; `accuracy` without TTA)
    seconds: float  # train.py's whole process

    def epoch_seconds(self) -> list[float]:
        return [float(row["time/epoch_seconds"]) for row in self.rows]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="config.json", help="relative to the repository")
    parser.add_argument("--compare", nargs="+", default=[], metavar="CONFIG", help="also these")
    parser.add_argument("--epochs", type=int, metavar="N", help="default: each config's")
    parser.add_argument("--seed", type=int, metavar="S", help="first seed; default: the config's")
    parser.add_argument("--seeds", type=int, default=1, metavar="N", help="default 1")
    parser.add_argument("--full", action="store_true", help="train on all 50,000 images")
    parser.add_argument("--test-data", type=Path, metavar="FOLDER", help="<class>/<image>")
    parser.add_argument("--pipeline", choices=["device", "dataloader"], help="the config's")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "cifar10", help="unpacked here")
    parser.add_argument("--archive", type=Path, default=ARCHIVE, metavar="PATH")
    parser.add_argument("--out", type=Path, metavar="DIR", help="default: a temporary folder")
    parser.add_argument("--min-accuracy", type=float, metavar="A", help="exit 1 below it")
    parser.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
    return parser.parse_args(argv)


def unpack(archive: Path, folder: Path) -> Path:
    """folder/train/<class>/*.jpg from the archive, unless it is there already."""
    if not (folder / "train").is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(folder, filter="data")
    return folder


def measured_config(config: dict, args: argparse.Namespace, seed: int, folder: Path) -> Path:
    """folder/config.json: `config` with its data read from the unpacked images, `seed`, and
    its outputs under `folder`."""
    config = json.loads(json.dumps(config))  # a copy: the caller's serves every seed
    loader = config["data_loader"]
    loader["type"] = "ImageFolderDataLoader"
    loader["args"].pop("download", None)
    loader["args"].update(data_dir=str(args.data), preset="cifar")
    if args.pipeline:
        loader["args"]["pipeline"] = args.pipeline
    if args.full:
        loader["args"]["validation_split"] = 0
        config["trainer"]["monitor"] = "off"  # nothing to validate on: train.py would refuse it
        # Named, so that test.py, reading train/ from another data_dir (scoring_folder), finds
        # its decoded images in the same cache (pipeline "device" decodes train/ to start).
        loader["args"].setdefault("cache_dir", str(args.data / ".cache"))
    if args.epochs:
        config["trainer"]["epochs"] = args.epochs
    config["seed"] = seed
    config["trainer"].update(save_dir=str(folder), loggers=["csv"], save_period=10**6)
    path = folder / "config.json"
    path.write_text(json.dumps(config, indent=4))
    return path


def scoring_folder(data: Path, test_data: Path, folder: Path) -> Path:
    """folder/train and folder/test, links to the training images and to --test-data: test.py
    --split test reads folder/test, and ImageFolderDataLoader wants train/ beside it (its class
    names, checked against test/'s)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, target in (("train", data / "train"), ("test", test_data)):
        (folder / name).unlink(missing_ok=True)  # an earlier --test-data, with --out
        (folder / name).symlink_to(target, target_is_directory=True)
    return folder


def run_python(arguments: list[str]) -> int:
    """`python <arguments>` in the repository: its exit status (the tests replace this)."""
    return subprocess.run([sys.executable, *arguments], cwd=ROOT).returncode


def evaluate(checkpoint: Path, split: str, results: Path, overrides: list[str]) -> float:
    """test.py's accuracy of `checkpoint` on `split`, its results kept at `results` (this
    benchmark's own file: replaced, as by a rerun with the same --out)."""
    arguments = ["test.py", "-r", str(checkpoint), "--split", split]
    arguments += ["--json", str(results), "--force"]
    code = run_python([*arguments, *overrides])
    if code != 0:
        raise StepFailed(code)
    return json.loads(results.read_text())["metrics"][f"{split}/accuracy"]


def train_and_score(
    config: dict, args: argparse.Namespace, *, seed: int, folder: Path, test_folder: Path | None
) -> Run:
    """One run of `config` with `seed` in `folder`, its final checkpoint scored by test.py."""
    config_path = measured_config(config, args, seed, folder)
    extra = [item for pair in args.set for item in ("--set", pair)]
    start = time.perf_counter()
    code = run_python(["train.py", "-c", str(config_path), "--run-id", f"seed{seed}", *extra])
    seconds = time.perf_counter() - start
    if code != 0:
        raise StepFailed(code)
    (run_dir,) = folder.glob(f"models/*/seed{seed}")
    (metrics,) = folder.glob(f"log/*/seed{seed}/metrics.csv")
    with metrics.open() as file:
        rows = list(csv.DictReader(file))
    checkpoint = run_dir / f"checkpoint-epoch{rows[-1]['epoch']}.pth"
    # The run's own config: the defaults and --set applied.
    trainer = json.loads((run_dir / "config.json").read_text())["trainer"]
    uses_tta = trainer["tta_flip"] or trainer["tta_translate"] > 0
    if test_folder is None:
        split, overrides = "val", []
        accuracy = float(rows[-1]["val/accuracy"])  # the last validation's, with the config's TTA
    else:
        split, overrides = "test", ["--set", f"data_loader.args.data_dir={test_folder}"]
        accuracy = evaluate(checkpoint, split, folder / "test.json", overrides)
    accuracy_no_tta = accuracy
    if uses_tta:
        accuracy_no_tta = evaluate(checkpoint, split, folder / "no_tta.json", overrides + NO_TTA)
    return Run(seed, rows, uses_tta, accuracy, accuracy_no_tta, seconds)


def print_epochs(name: str, run: Run, args: argparse.Namespace) -> None:
    """The run's epochs as metrics.csv has them, then its final model with and without TTA."""
    tta = "its TTA" if run.uses_tta else "no TTA in the config"
    print(f"\n{name}, seed {run.seed} ({' '.join(args.set) or 'as configured'}), "
          f"train.py {run.seconds:.0f} s in all; val/accuracy with {tta}")  # fmt: skip
    print("epoch  val/accuracy  seconds  train samples/s")
    for row in run.rows:
        # Empty, or absent, without validation (--full).
        accuracy = f"{float(row['val/accuracy']):.4f}" if row.get("val/accuracy") else "-"
        print(
            f"{row['epoch']:>5}  {accuracy:>12}  {float(row['time/epoch_seconds']):7.1f}  "
            f"{float(row['time/train_samples_per_second']):15.0f}"
        )
    split = "test" if args.full else "val"
    print(f"final model, {split}/accuracy: {run.accuracy:.4f} with {tta}, "
          f"{run.accuracy_no_tta:.4f} without TTA")  # fmt: skip


def mean_and_spread(values: list[float]) -> str:
    """'0.9031' for one value; 'mean ± sample std (min-max)' for several."""
    if len(values) == 1:
        return f"{values[0]:.4f}"
    spread = f"{min(values):.4f}-{max(values):.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f} ({spread})"


def summary_table(results: dict[str, list[Run]], full: bool) -> list[str]:
    """The markdown table: a row per config, its figures the mean over its seeds."""
    split = "test" if full else "val"
    lines = [
        f"| config | epochs | seeds | final {split} accuracy, with TTA | without TTA "
        "| s/epoch | train.py s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        seeds = ", ".join(str(run.seed) for run in runs)
        with_tta = "-" if not runs[0].uses_tta else mean_and_spread([r.accuracy for r in runs])
        without_tta = mean_and_spread([run.accuracy_no_tta for run in runs])
        epoch_seconds = statistics.mean(s for run in runs for s in run.epoch_seconds())
        seconds = statistics.mean(run.seconds for run in runs)
        lines.append(
            f"| {name} | {len(runs[0].rows)} | {seeds} | {with_tta} | {without_tta} "
            f"| {epoch_seconds:.1f} | {seconds:.0f} |"
        )
    return lines


def refusal(args: argparse.Namespace, stems: list[str]) -> str | None:
    """What is wrong with the arguments, in one line; None when nothing is."""
    if len(set(stems)) < len(stems):
        # Each config's runs go to <out>/<its file name>/: two of one name would share a folder.
        return f"--config and --compare need files of different names, got {stems}"
    if args.full and args.test_data is None:
        return "--full trains on every image: it needs --test-data FOLDER to score on"
    if args.test_data is not None and not (args.full and args.test_data.is_dir()):
        return f"--test-data {args.test_data}: must be a folder, and comes with --full"
    if args.seeds < 1:
        return f"--seeds {args.seeds}: must be at least 1"
    if not (args.data / "train").is_dir() and not args.archive.is_file():
        return f"no images in {args.data} and no archive at {args.archive}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [args.config, *args.compare]
    args.data = args.data.resolve()  # train.py and test.py run in the repository, not here
    stems = [Path(name).stem for name in names]
    message = refusal(args, stems)
    if message is not None:
        print(f"error: {message}", file=sys.stderr)
        return 2
    unpack(args.archive, args.data)
    results: dict[str, list[Run]] = {}
    with contextlib.ExitStack() as stack:
        out = args.out or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        out = out.resolve()
        test_folder = None
        if args.full:
            test_folder = scoring_folder(args.data, args.test_data.resolve(), out / "test_data")
        for name, stem in zip(names, stems, strict=True):
            config = json.loads((ROOT / name).read_text())
            first = args.seed if args.seed is not None else config.get("seed", 0)  # the schema's
            results[name] = []
            for seed in range(first, first + args.seeds):
                folder = out / stem / f"seed{seed}"
                folder.mkdir(parents=True, exist_ok=True)
                try:
                    run = train_and_score(
                        config, args, seed=seed, folder=folder, test_folder=test_folder
                    )
                except StepFailed as failure:
                    return failure.code
                print_epochs(name, run, args)
                results[name].append(run)
    print()
    print("\n".join(summary_table(results, args.full)))
    print("mean over the seeds; with two or more, ± the sample std (min-max)")
    if args.min_accuracy is None:
        return 0
    runs = results[args.config]
    accuracy = statistics.mean(run.accuracy for run in runs)
    seeds = f" (mean of {len(runs)} seeds)" if len(runs) > 1 else ""
    seconds = statistics.mean(run.seconds for run in runs)
    epoch_seconds = statistics.mean(sum(run.epoch_seconds()) for run in runs)
    # The last epoch's model FLOP utilisation, where the device's peak is known (a GPU).
    mfu = runs[-1].rows[-1].get("time/mfu")
    utilisation = f", MFU {100 * float(mfu):.3g} %" if mfu else ""
    print(
        f"figure: {'test' if args.full else 'val'}/accuracy {accuracy:.4f}{seeds} after "
        f"{len(runs[0].rows)} epochs, {seconds:.0f} s whole process ({epoch_seconds:.1f} s in "
        f"epochs){utilisation}",
        flush=True,
    )
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())

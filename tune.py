"""Tune a config before training it: the learning-rate range test, the largest batch that fits
(docs/performance.md).

python tune.py -c configs/demo.json --lr-range               # the LR range test, a suggested lr
python tune.py -c configs/demo.json --batch-size --max-memory 2      # under 2 GiB of memory
torchrun --standalone --nproc_per_node=2 tune.py -c config.json --lr-range
"""

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported in main(), after parsing, so that --help answers at once
    import torch

    from parse_config import ConfigParser
    from utils.distributed.process_group import ProcessInfo
    from utils.optim.lr_range import RangeTest


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Tune a config: the learning-rate range test, or the largest batch that fits."
    )
    add = parser.add_argument
    # fmt: off
    add("-c", "--config", required=True, help="config file")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--lr-range", action="store_true",
        help="the learning-rate range test: a curve of the loss and a suggested optimizer.args.lr")
    what.add_argument("--batch-size", action="store_true",
        help="the largest per-process batch whose training step fits in memory")
    add("--max-memory", type=float, metavar="GIB",
        help="with --batch-size: a budget of peak memory (required on the CPU: the process's "
             "peak resident memory; on CUDA: torch's allocator, else until out of memory)")
    add("--max-batch", type=int, default=65536, help="with --batch-size: the largest tried")
    add("--steps", type=int, default=100, help="optimizer steps at most (default 100)")
    add("--min-lr", type=float, default=1e-7, help="the first learning rate (default 1e-7)")
    add("--max-lr", type=float, default=10.0, help="the last learning rate (default 10)")
    add("-d", "--device", help="GPUs to use, e.g. 0 (sets CUDA_VISIBLE_DEVICES)")
    add("--run-id", help="name of the output folder under saved/log/<name>/ (default: the time)")
    add("--set", action="append", metavar="KEY.PATH=VALUE", help="override a config key")
    # fmt: on
    args = parser.parse_args(argv)
    # float() takes "inf" and "nan": an infinite --max-lr made every rate nan or inf, a nan
    # --max-memory a ValueError in the middle of the search.
    if args.steps < 3 or not 0 < args.min_lr < args.max_lr < math.inf:
        parser.error("--steps must be >= 3 and 0 < --min-lr < --max-lr, both finite")
    if not (args.max_memory is None or 0 < args.max_memory < math.inf) or args.max_batch < 1:
        parser.error("--max-memory and --max-batch must be > 0 (--max-memory finite)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import os

    from parse_config import ConfigParser
    from utils import UserError
    from utils.distributed.device import gpu_indices
    from utils.util import TrainingError

    try:
        if args.device is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu_indices(args.device)
        run(ConfigParser.from_args(args), args)
    except (UserError, TrainingError) as error:
        # 2: a mistake in the input; 1: training cannot go on (a non-finite loss). As train.py.
        print(f"error: {error}", file=sys.stderr)
        return 2 if isinstance(error, UserError) else 1
    return 0


def run(config: "ConfigParser", args: argparse.Namespace) -> None:
    from logger import setup_logging
    from utils.distributed.device import run_device, use_device
    from utils.distributed.process_group import barrier, process_group, process_info

    info = process_info()
    setup_logging(None, verbosity=config["trainer"]["verbosity"], rank=info.rank)
    device = run_device(config, logging.getLogger("tune"), info)
    use_device(device)
    distributed = config["distributed"]
    with process_group(info, distributed["backend"], device, distributed["timeout"]):
        (tune_lr if args.lr_range else tune_batch_size)(config, info, device, args)
        barrier()


def tune_lr(
    config: "ConfigParser", info: "ProcessInfo", device: "torch.device", args: argparse.Namespace
) -> None:
    from base.tuning import config_rates, lr_range_test
    from build import build_trainer
    from utils import UserError, configure_torch, seed_everything
    from utils.distributed.process_group import broadcast_object
    from utils.optim.lr_range import geometric
    from utils.state.run_folder import default_run_id
    from utils.util import TrainingError

    logger = logging.getLogger("tune")
    seed_everything(config["seed"])
    configure_torch(config["trainer"], device)
    if not config.run_id_given:
        config.run_id = default_run_id(config.run_id, broadcast_object)
    out = config.log_dir
    # Another run's folder, an earlier test's, or a file: kept (a file cannot be listed).
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out}: already exists; choose another --run-id")
    check_creatable(out)
    trainer = build_trainer(config, info, device, logger)
    trainer.check_first_batch()
    base_lr = config_rates(trainer)[0]  # what the suggestion replaces
    result = lr_range_test(trainer, geometric(args.min_lr, args.max_lr, args.steps))
    if not result.lrs:  # every rank alike: the loss is averaged over them
        # The first step's loss comes before any update: the learning rate has no part in it.
        raise TrainingError(
            "the loss of the range test's first step is not finite, before any update at any "
            "learning rate: check the data and the model; nothing was written"
        )
    if info.is_main:
        save_outputs(result, out)
        report(result, config, base_lr, out, logger)


def tune_batch_size(
    config: "ConfigParser", info: "ProcessInfo", device: "torch.device", args: argparse.Namespace
) -> None:
    from base.tuning import largest_batch, samples_per_pass
    from build import build_trainer
    from utils import UserError, configure_torch, seed_everything

    logger = logging.getLogger("tune")
    if device.type != "cuda" and args.max_memory is None:
        raise UserError("--batch-size on the CPU: give a budget with --max-memory GIB")
    if device.type == "cpu" and not Path("/proc/self/clear_refs").exists():
        raise UserError("--batch-size on the CPU measures memory through Linux's /proc")
    seed_everything(config["seed"])
    configure_torch(config["trainer"], device)
    trainer = build_trainer(config, info, device, logger)
    trainer.check_first_batch()
    budget = None if args.max_memory is None else int(args.max_memory * 2**30)
    # The loader forms no batch larger than a pass of this process's samples: a larger answer
    # would train on one batch of them all (or none, with drop_last).
    whole = samples_per_pass(trainer.train_loader)
    size = largest_batch(trainer, budget, min(args.max_batch, whole or args.max_batch))
    if size is None:
        where = "the GPU's memory" if args.max_memory is None else f"{args.max_memory} GiB"
        if device.type == "cpu":  # what a budget below the process at rest cannot hold
            where += " of the process's peak resident memory (the model, data and torch count)"
        raise UserError(f"not even a batch of 1 fits in {where}")
    if info.is_main:
        old = config["data_loader"]["args"]["batch_size"]
        print(f"Largest batch that fits: {size} per process (the config's: {old}).")
        print(f"  --set data_loader.args.batch_size={size}")
        if size == whole:
            print(f"  (every training sample of this process, {whole}: no larger batch exists)")
        if config["optimizer"]["reference_batch_size"] is None:  # the linear scaling rule
            sets = " ".join(f"--set {text}" for text in rate_sets(config, size / old))
            print(f"  {sets}   (scaled with the batch, x{size / old:.3g})")
        else:
            print("  (optimizer.reference_batch_size scales the learning rates to the batch)")


def check_creatable(out: Path) -> None:
    """Refuse, before the range test, an output folder that cannot be made: else the test ran
    to its end and its writes failed with a traceback. Not made yet: a run that writes nothing
    (a first loss that is not finite) leaves no folder."""
    import os

    from utils import UserError

    existing = next(folder for folder in (out, *out.parents) if folder.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(
            f"{out}: cannot be created: {existing} is not a writable folder; set another "
            "trainer.save_dir"
        )


def save_outputs(result: "RangeTest", out: "Path") -> None:
    """lr_range.csv, lr_range.png and TensorBoard's lr_range/ tags in `out`, each file written
    atomically (a crash leaves it whole or absent)."""
    from logger.visualization import TensorboardLogger
    from utils.evaluation.confusion import image_tensor
    from utils.optim.lr_range import csv_text, draw
    from utils.state.checkpoint import write_atomic, write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "lr_range.csv", csv_text(result))
    image = draw(result)
    write_atomic(out / "lr_range.png", lambda file: image.save(file, format="PNG"))
    board = TensorboardLogger(out)
    for step, values in enumerate(zip(result.lrs, result.losses, result.smoothed, strict=True)):
        tags = ("lr_range/lr", "lr_range/loss", "lr_range/smoothed_loss")
        board.log_scalars(dict(zip(tags, values, strict=True)), step)
    board.log_image("lr_range/curve", image_tensor(image), len(result.lrs))
    board.close(finished=True)


def report(
    result: "RangeTest", config: "ConfigParser", base_lr: float, out: "Path", logger: logging.Logger
) -> None:
    """The suggestion, as the --set line that gives it for this config."""
    logger.info(
        "Learning-rate range test: %d steps from %.3g to %.3g (%s). Curve: %s",
        len(result.lrs), result.lrs[0], result.lrs[-1], result.stopped, out / "lr_range.png",
    )  # fmt: skip
    if result.suggestion is None:
        logger.warning("No descent of the loss to read: lower --min-lr or raise --steps.")
        return
    # The config's rate maps to the first group's by a fixed factor (reference_batch_size, a
    # group's own rate): the same factor maps the suggestion back. The test kept every group's
    # ratio to the first: every rate the config sets is scaled alike.
    sets = rate_sets(config, result.suggestion / base_lr)
    print(f"Suggested learning rate {result.suggestion:.4g} (the steepest descent of the loss):")
    print("  " + " ".join(f"--set {text}" for text in sets))


# Schedules that set the learning rates themselves, in place of the optimizer's (which they
# overwrite when built): their arguments that hold rates, one per group or one for all.
SCHEDULE_RATES = {"OneCycleLR": ("max_lr",), "CyclicLR": ("base_lr", "max_lr")}


def rate_sets(config: "ConfigParser", factor: float) -> list[str]:
    """The --set values that multiply every learning rate the config trains with by `factor`:
    the rates of a schedule that sets its own (SCHEDULE_RATES); else optimizer.args.lr and the
    rate of each group that has its own."""
    schedule = config["lr_scheduler"] or {}
    if schedule.get("type") in SCHEDULE_RATES:
        sets = []
        for name in SCHEDULE_RATES[schedule["type"]]:
            rates = schedule["args"][name]
            listed = rates if isinstance(rates, list) else [rates]
            scaled = [float(f"{rate * factor:.4g}") for rate in listed]
            value = scaled if isinstance(rates, list) else scaled[0]
            # No spaces: the line pastes into a shell as one argument.
            sets.append(f"lr_scheduler.args.{name}={json.dumps(value, separators=(',', ':'))}")
        return sets
    optimizer = config["optimizer"]
    sets = [f"optimizer.args.lr={optimizer['args']['lr'] * factor:.4g}"]
    for index, group in enumerate(optimizer.get("param_groups") or []):
        if "lr" in group:
            sets.append(f"optimizer.param_groups.{index}.lr={group['lr'] * factor:.4g}")
    return sets


if __name__ == "__main__":
    sys.exit(main())

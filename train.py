"""Train a model described by a JSON config.

python train.py -c configs/demo.json
python train.py -r saved/models/<name>/<run_id>/checkpoint-epoch2.pth   # resume
torchrun --standalone --nproc_per_node=2 train.py -c config.json        # several GPUs
"""

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported in main(), after parsing, so that --help answers at once
    from collections.abc import Callable

    import torch

    from parse_config import ConfigParser
    from utils.distributed.process_group import ProcessInfo


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a model from a JSON config.")
    add = parser.add_argument
    # fmt: off
    add("-c", "--config", help="config file (default: the run's own when resuming)")
    add("-r", "--resume", metavar="CKPT", help="checkpoint (or run folder) to resume from")
    add("--continue", dest="continue_run", action="store_true",
        help="with -r CKPT -c CONFIG: keep the checkpoint's epoch count, not a new run")
    add("-d", "--device", help="GPUs to use, e.g. 0 (sets CUDA_VISIBLE_DEVICES)")
    add("--lr", type=float, help="shortcut for --set optimizer.args.lr=LR")
    add("--bs", type=int, help="shortcut for --set data_loader.args.batch_size=BS")
    add("--epochs", type=int, help="shortcut for --set trainer.epochs=N")
    add("--folds", type=int, metavar="K", help="k-fold cross-validation with K folds")
    add("--fold", type=int, metavar="I", help="with --folds: train only fold I")
    add("--run-id", help="name of the run folder (default: start time + random suffix)")
    add("--set", action="append", metavar="KEY.PATH=VALUE",
        help="override any config key; VALUE is JSON if it parses, else a string (repeatable)")
    add("--requeue-file", metavar="PATH",
        help="on a stop signal: write PATH after saving, exit 0 (for job scripts that requeue)")
    add("--allow-data-change", action="store_true",
        help="resume on data other than the checkpoint's (refused by default)")
    # fmt: on
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from parse_config import ConfigParser
    from utils import UserError
    from utils.distributed.device import gpu_indices
    from utils.state.run_folder import request_requeue
    from utils.util import Interrupted, TrainingError

    try:
        if args.device is not None:  # before anything initialises CUDA (importing torch does not)
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu_indices(args.device)
        run(ConfigParser.from_args(args))
    except (UserError, TrainingError) as error:
        # 2: a mistake in the input, nothing was written; 1: e.g. a non-finite loss.
        print(f"error: {error}", file=sys.stderr)
        return 2 if isinstance(error, UserError) else 1
    except Interrupted as stop:  # preempted: a resumable checkpoint was saved
        print(f"Interrupted: {stop}", file=sys.stderr)
        requeue = args.requeue_file
        return 128 + stop.signum if requeue is None else request_requeue(Path(requeue))
    except KeyboardInterrupt:  # a second Ctrl-C
        print("Interrupted at once (second signal): nothing more was saved.", file=sys.stderr)
        return 130
    return 0


def run(config: "ConfigParser") -> None:
    from logger import setup_logging
    from utils.distributed.device import run_device, use_device
    from utils.distributed.process_group import barrier, process_group, process_info
    from utils.state.folds import SUMMARY, cross_validate, summary_lines

    info = process_info()  # rank 0 of 1 without torchrun
    setup_logging(None, verbosity=config["trainer"]["verbosity"], rank=info.rank)
    device = run_device(config, logging.getLogger("train"), info)  # or a one-line error
    use_device(device)  # before anything touches CUDA: cuda:N, not GPU 0
    distributed = config["distributed"]
    with process_group(info, distributed["backend"], device, distributed["timeout"]):
        if config.num_folds is None:
            train(config, info, device)
        elif (summary := cross_validate(config, info, device, train)) is not None:
            # The summary belongs to the whole run: its own log folder, above the folds'.
            setup_logging(config.run_log_dir, verbosity=config["trainer"]["verbosity"])
            for line in [*summary_lines(summary), f"Saved {config.run_checkpoint_dir / SUMMARY}"]:
                logging.getLogger("train").info("%s", line)
        # Leave together: a rank that tears down its process group while another still runs
        # its last collective can abort. Only on success: after an error the others may not.
        barrier()


def train(
    config: "ConfigParser",
    info: "ProcessInfo",
    device: "torch.device",
    finish: "Callable[[ConfigParser, int | None], dict | None] | None" = None,
) -> dict | None:
    """Train the run; then finish(config, number of validation samples) on rank 0 (a
    cross-validation's fold result and summary) and return what it returns (None on the other
    ranks, and without `finish`)."""
    import contextlib

    from build import build_trainer
    from logger import setup_logging
    from model.metric import sample_mean_names
    from utils import configure_torch, seed_everything
    from utils.data.batches import num_samples
    from utils.distributed.process_group import broadcast_object, on_rank0, said_by_rank0
    from utils.state.run_folder import default_run_id, find_resume_point, prepare_run_folder

    verbosity = config["trainer"]["verbosity"]
    # Console only until every check has passed: a bad input must not leave a run folder behind.
    setup_logging(None, verbosity=verbosity, rank=info.rank)
    seed_everything(config["seed"])
    configure_torch(config["trainer"], device)
    if not config.run_id_given:
        config.run_id = default_run_id(config.run_id, broadcast_object)
    # Rank 0 alone inspects the run folder; its answer (or error) reaches every rank. Every rank
    # then loads the checkpoint, and only once every check has passed does rank 0 change the
    # folder (leftovers cleared, a timeline left behind set aside). Found first: a resumed
    # model's pretrained weights are not read (offline, their file may be gone).
    point = on_rank0(find_resume_point, config)
    resumed = point.path is not None
    # Every rank builds from one config and reads one data folder: their warnings (a schedule
    # shorter than the run, image files of a format not read) once.
    loggers = (logging.getLogger("train"), logging.getLogger("data"))
    with said_by_rank0(loggers, info.rank, verbosity):
        trainer = build_trainer(config, info, device, logging.getLogger("train"), resumed=resumed)
    trainer.resume(point)
    trainer.check_first_batch()  # the data's dtypes and shapes against the model and the loss
    # Rank 0 holds the run folder's lock from here until the run ends (also by an error): a
    # second start there is refused. The OS lets it go if the process dies.
    with contextlib.ExitStack() as locks:
        on_rank0(prepare_run_folder, config, point, locks)
        setup_logging(config.log_dir, verbosity=verbosity, rank=info.rank)
        trainer.fit()
        # Still under the lock: no other start takes the folder while these files are written.
        if finish is None or not info.is_main:
            return None
        # The fold's count, which the summary weighs its means by (not in the checkpoint).
        count = num_samples(trainer.val_loader) if trainer.val_loader is not None else None
        return finish(config, count, sample_mean_names(config["metrics"]), trainer.metric_fns)


if __name__ == "__main__":
    exit_code = main()
    from utils.util import freeze_heap_for_exit  # imported by main() already

    freeze_heap_for_exit()
    sys.exit(exit_code)

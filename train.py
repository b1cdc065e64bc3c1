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

if TYPE_CHECKING:
    import torch

    from parse_config import ConfigParser
    from utils.distributed import ProcessInfo


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a model from a JSON config.")
    parser.add_argument("-c", "--config", help="config file (default: the run's own when resuming)")
    parser.add_argument("-r", "--resume", metavar="CKPT", help="checkpoint to resume from")
    parser.add_argument(
        "--continue", dest="continue_run", action="store_true",
        help="with -r CKPT -c CONFIG: keep the checkpoint's epoch count and training state "
        "instead of starting a new run at epoch 1",
    )  # fmt: skip
    parser.add_argument(
        "-d", "--device", help="GPUs to use, e.g. 0 or 0,1 (sets CUDA_VISIBLE_DEVICES)"
    )
    parser.add_argument("--lr", type=float, help="shortcut for --set optimizer.args.lr=LR")
    parser.add_argument("--bs", type=int, help="shortcut for --set data_loader.args.batch_size=BS")
    parser.add_argument("--epochs", type=int, help="shortcut for --set trainer.epochs=N")
    parser.add_argument(
        "--folds", type=int, metavar="K",
        help="k-fold cross-validation: train K folds (shortcut for --set data_loader.args.folds=K)",
    )  # fmt: skip
    parser.add_argument(
        "--fold", type=int, metavar="I",
        help="train only fold I of the K (shortcut for --set data_loader.args.fold=I)",
    )  # fmt: skip
    parser.add_argument(
        "--run-id", help="name of the run folder (default: start time + random suffix)"
    )
    parser.add_argument(
        "--set", action="append", metavar="KEY.PATH=VALUE",
        help="override any config key; VALUE is JSON if it parses, else a string (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--requeue-file", metavar="PATH",
        help="for job scripts that requeue: when a signal stops training, write PATH after the "
        "checkpoint is saved and exit 0 (so torchrun does not restart the workers)",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = args.device  # before anything initialises CUDA
    # Imported after parsing so that --help answers without loading torch.
    from base.base_trainer import Interrupted, TrainingError
    from parse_config import ConfigParser
    from utils import UserError

    try:
        run(ConfigParser.from_args(args))
    except UserError as error:  # a mistake in the input: nothing was written
        print(f"error: {error}", file=sys.stderr)
        return 2
    except TrainingError as error:  # e.g. a non-finite loss; saved checkpoints are intact
        print(f"error: {error}", file=sys.stderr)
        return 1
    except Interrupted as stop:  # preempted: a resumable checkpoint was saved
        print(f"Interrupted: {stop}", file=sys.stderr)
        if args.requeue_file is None:
            return 128 + stop.signum
        return request_requeue(Path(args.requeue_file))
    except KeyboardInterrupt:  # a second Ctrl-C
        print("Interrupted at once (second signal): nothing more was saved.", file=sys.stderr)
        return 130
    return 0


def request_requeue(path: Path) -> int:
    """Write the file a job script reads as "checkpoint saved, requeue me" (rank 0); the exit
    code 0 tells torchrun that the worker did not crash, so --max-restarts does not restart it."""
    from utils.checkpoint import write_text_atomic
    from utils.distributed import process_info

    if not process_info().is_main:
        return 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, "preempted: the newest checkpoint resumes the run\n")
    except OSError as error:
        print(f"error: {path}: cannot write ({error.strerror})", file=sys.stderr)
        return 1
    return 0


def run(config: "ConfigParser") -> None:
    from logger import setup_logging
    from utils import select_device
    from utils.distributed import barrier, close_distributed, init_distributed, process_info

    info = process_info()  # rank 0 of 1 without torchrun
    # Console only until every check has passed: a bad input must not leave a run folder behind.
    setup_logging(None, verbosity=config["trainer"]["verbosity"], rank=info.rank)
    device = select_device(config["n_gpu"], logging.getLogger("train"), local_rank=info.local_rank)
    # Under torchrun: join the process group, with the backend the device needs.
    init_distributed(info, config["distributed"]["backend"], device)
    try:
        if config.num_folds is None:
            train(config, info, device)
        else:
            cross_validate(config, info, device)
        # Leave together: a rank that tears down its process group while another still
        # finishes its last collective can abort ("terminate called without an active
        # exception"). Only on success: after an error the others may never get here.
        barrier()
    finally:
        close_distributed()


def cross_validate(config: "ConfigParser", info: "ProcessInfo", device: "torch.device") -> None:
    """Train fold data_loader.args.fold, or every fold in turn, each in the run's fold-<i>/;
    once every fold has finished, write folds_summary.json and log it (rank 0)."""
    from logger import setup_logging
    from utils.distributed import broadcast_object
    from utils.folds import SUMMARY, finish_fold, summary_lines
    from utils.run_folder import default_run_id

    if not config.run_id_given:
        # Every fold (and rank) writes into one run folder: name it before the first fold.
        config.run_id = default_run_id(config.run_id, broadcast_object)
    summary = None
    for fold in range(config.num_folds) if config.fold is None else [config.fold]:
        fold_config = config.for_fold(fold)
        train(fold_config, info, device)
        summary = finish_fold(fold_config) if info.is_main else None
    if not info.is_main:
        return
    logger = logging.getLogger("train")
    if summary is None:
        logger.info(
            "Fold %d finished; %s follows when every fold (0 to %d) has.",
            fold, SUMMARY, config.num_folds - 1,
        )  # fmt: skip
        return
    # The summary belongs to the whole run: its own log folder, above the folds'.
    setup_logging(config.run_log_dir, verbosity=config["trainer"]["verbosity"], rank=info.rank)
    for line in summary_lines(summary):
        logger.info("%s", line)
    logger.info("Saved %s", config.run_checkpoint_dir / SUMMARY)


def train(config: "ConfigParser", info: "ProcessInfo", device: "torch.device") -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    import data_loader.data_loaders as data_module
    import model.loss as loss_module
    import model.metric as metric_module
    import model.model as arch_module
    from logger import setup_logging
    from trainer import Trainer
    from utils import UserError, configure_torch, seed_everything
    from utils.distributed import broadcast_object, is_distributed, once_per_node
    from utils.optim import build_optimizer, freeze
    from utils.run_folder import default_run_id, find_resume_point, prepare_run_folder

    verbosity = config["trainer"]["verbosity"]
    setup_logging(None, verbosity=verbosity, rank=info.rank)
    logger = logging.getLogger("train")
    seed_everything(config["seed"])
    trainer_config = config["trainer"]
    configure_torch(trainer_config)
    if not config.run_id_given:
        config.run_id = default_run_id(config.run_id, broadcast_object)

    data = config.init_obj(
        "data_loader",
        data_module,
        seed=config["seed"],
        rank=info.rank,
        num_replicas=info.world_size,
    )
    # Downloads happen once per node, before any rank reads the files.
    once_per_node(data.prepare_data, info)
    model = config.init_obj("arch", arch_module)
    freeze(config, model)
    model = model.to(device)
    if info.world_size > 1 and config["distributed"]["sync_bn"]:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    criterion = config.lookup(loss_module, config["loss"], "loss")
    metric_fns = {
        name: config.lookup(metric_module, name, f"metrics[{index}]")
        for index, name in enumerate(config["metrics"])
    }
    optimizer = build_optimizer(config, model, device)
    lr_scheduler = None
    if config["lr_scheduler"] is not None:
        lr_scheduler = config.init_obj("lr_scheduler", torch.optim.lr_scheduler, optimizer)
    if trainer_config["channels_last"]:
        model = model.to(memory_format=torch.channels_last)  # NHWC: faster convolutions on GPUs
    if is_distributed():
        # No buffer broadcast before every forward: rank 0's BatchNorm statistics come from its
        # own batches either way, and validation copies them to every rank (sync_buffers).
        model = DistributedDataParallel(
            model,
            device_ids=None if device.index is None else [device.index],
            broadcast_buffers=False,
        )
    if trainer_config["compile"]:
        # Compiled lazily at the first batch; checkpoints still hold the plain model's state.
        model = torch.compile(model, mode=trainer_config["compile_mode"])
    trainer = Trainer(
        model, criterion, metric_fns, optimizer,
        config=config, device=device, data=data, lr_scheduler=lr_scheduler, logger=logger, rank=info.rank,
    )  # fmt: skip

    # Rank 0 inspects the run folder and decides for every rank: the others must not race its
    # writes, and an error must stop them all rather than leave them waiting.
    resume, error = broadcast_object(find_resume_point(config) if info.is_main else None)
    if error:
        raise UserError(error)
    if resume is not None:
        trainer.resume(resume)
    error = prepare_run_folder(config) if info.is_main else None
    if broadcast_object(error):
        raise UserError(error)
    setup_logging(config.log_dir, verbosity=verbosity, rank=info.rank)
    trainer.train()


if __name__ == "__main__":
    sys.exit(main())

"""Train a model described by a JSON config.

python train.py -c configs/demo.json
python train.py -r saved/models/<name>/<run_id>/checkpoint-epoch2.pth   # resume
torchrun --standalone --nproc_per_node=2 train.py -c config.json        # several GPUs
"""

import argparse
import json
import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from parse_config import ConfigParser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a model from a JSON config.")
    parser.add_argument("-c", "--config", help="config file (default: the run's own when resuming)")
    parser.add_argument("-r", "--resume", metavar="CKPT", help="checkpoint to resume from")
    parser.add_argument(
        "-d", "--device", help="GPUs to use, e.g. 0 or 0,1 (sets CUDA_VISIBLE_DEVICES)"
    )
    parser.add_argument("--lr", type=float, help="shortcut for --set optimizer.args.lr=LR")
    parser.add_argument("--bs", type=int, help="shortcut for --set data_loader.args.batch_size=BS")
    parser.add_argument("--epochs", type=int, help="shortcut for --set trainer.epochs=N")
    parser.add_argument(
        "--run-id", help="name of the run folder (default: start time + random suffix)"
    )
    parser.add_argument(
        "--set", action="append", metavar="KEY.PATH=VALUE",
        help="override any config key; VALUE is JSON if it parses, else a string (repeatable)",
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
        return 128 + stop.signum
    except KeyboardInterrupt:  # a second Ctrl-C
        print("Interrupted at once (second signal): nothing more was saved.", file=sys.stderr)
        return 130
    return 0


def run(config: "ConfigParser") -> None:
    import torch

    import data_loader.data_loaders as data_module
    import model.loss as loss_module
    import model.metric as metric_module
    import model.model as arch_module
    from logger import setup_logging
    from trainer import Trainer
    from utils import UserError, seed_everything, select_device
    from utils.checkpoint import write_text_atomic

    # Console only until every check has passed: a bad input must not leave a run folder behind.
    setup_logging(None, verbosity=config["trainer"]["verbosity"])
    logger = logging.getLogger("train")
    seed_everything(config["seed"])
    if config["trainer"]["deterministic"]:
        # Bit-exact reruns: refuse non-deterministic kernels (cuBLAS needs this workspace setting).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    device = select_device(config["n_gpu"], logger)

    data = config.init_obj("data_loader", data_module, seed=config["seed"])
    model = config.init_obj("arch", arch_module).to(device)
    criterion = config.lookup(loss_module, config["loss"], "loss")
    metric_fns = {
        name: config.lookup(metric_module, name, f"metrics[{index}]")
        for index, name in enumerate(config["metrics"])
    }
    optimizer = config.init_obj(
        "optimizer", torch.optim, [param for param in model.parameters() if param.requires_grad]
    )
    lr_scheduler = None
    if config["lr_scheduler"] is not None:
        lr_scheduler = config.init_obj("lr_scheduler", torch.optim.lr_scheduler, optimizer)
    trainer = Trainer(
        model, criterion, metric_fns, optimizer,
        config=config, device=device, data=data, lr_scheduler=lr_scheduler, logger=logger,
    )  # fmt: skip
    if config.resume is not None:
        trainer.resume(config.resume)

    checkpoint_dir = config.checkpoint_dir
    if config.resume is None and checkpoint_dir.is_dir() and any(checkpoint_dir.iterdir()):
        raise UserError(
            f"{checkpoint_dir}: this run already exists; resume it with -r <checkpoint> "
            "or choose another --run-id"
        )
    try:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        config.log_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(
            checkpoint_dir / "config.json", json.dumps(config.config, indent=4) + "\n"
        )
    except OSError as error:
        raise UserError(
            f"{error.filename or checkpoint_dir}: cannot write the run folder ({error.strerror}); "
            "check trainer.save_dir"
        ) from None
    setup_logging(config.log_dir, verbosity=config["trainer"]["verbosity"])
    trainer.train()


if __name__ == "__main__":
    sys.exit(main())

"""Evaluate a checkpoint on the test (or validation) split.

python test.py -r saved/models/<name>/<run_id>/model_best.pth [--split val] [--json out.json]
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
    parser = argparse.ArgumentParser(description="Evaluate a checkpoint.")
    parser.add_argument(
        "-r", "--resume", metavar="CKPT", required=True, help="checkpoint to evaluate"
    )
    parser.add_argument(
        "-c", "--config", help="config (default: config.json beside the checkpoint)"
    )
    parser.add_argument("-d", "--device", help="GPUs to use, e.g. 0 (sets CUDA_VISIBLE_DEVICES)")
    parser.add_argument("--split", choices=["test", "val"], default="test", help="default: test")
    parser.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
    parser.add_argument(
        "--set", action="append", metavar="KEY.PATH=VALUE",
        help="override a config key, e.g. data_loader.args.data_dir=/data (repeatable)",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = args.device
    from parse_config import ConfigParser
    from utils import UserError

    try:
        results = evaluate_checkpoint(ConfigParser.from_args(args), args.split)
        if args.json:
            try:
                with open(args.json, "w", encoding="utf-8") as file:
                    json.dump(results, file, indent=4)
            except OSError as error:
                raise UserError(f"{args.json}: cannot write ({error.strerror})") from None
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def evaluate_checkpoint(config: "ConfigParser", split: str) -> dict:
    import torch

    import data_loader.data_loaders as data_module
    import model.loss as loss_module
    import model.metric as metric_module
    import model.model as arch_module
    from logger import setup_logging
    from trainer import evaluate
    from utils import amp_dtype, load_checkpoint, seed_everything, select_device
    from utils.checkpoint import load_model_state

    setup_logging(None, verbosity=1)
    logger = logging.getLogger("test")
    seed_everything(config["seed"])
    device = select_device(config["n_gpu"], logger)
    state = load_checkpoint(config.resume, map_location="cpu")
    model = config.init_obj("arch", arch_module).to(device)
    load_model_state(model, state, config.resume)
    data = config.init_obj("data_loader", data_module, seed=config["seed"])
    data.prepare_data()
    criterion = config.lookup(loss_module, config["loss"], "loss")
    metric_fns = {name: config.lookup(metric_module, name, "metrics") for name in config["metrics"]}
    class_names = data.class_names()

    # The precision and memory format the run validated with, so --split val reproduces it.
    trainer_config = config["trainer"]
    if trainer_config["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    metrics, per_class = evaluate(
        model, data.eval_loader(split), criterion, metric_fns, device,
        prefix=split, num_classes=len(class_names),
        amp_dtype=amp_dtype(trainer_config["amp"]), channels_last=trainer_config["channels_last"],
    )  # fmt: skip
    num_samples = int(metrics.pop(f"{split}/num_samples"))
    correct, total = per_class.tolist()
    per_class_accuracy = {
        name: (hits / count if count else None)
        for name, hits, count in zip(class_names, correct, total, strict=True)
    }
    logger.info(
        "%s: %d samples from %s (epoch %d)", split, num_samples, config.resume, state["epoch"]
    )
    for key, value in metrics.items():
        logger.info("  %-20s %.4f", key, value)
    for name, accuracy in per_class_accuracy.items():
        logger.info(
            "  accuracy of %-10s %s", name, "n/a" if accuracy is None else f"{accuracy:.4f}"
        )
    return {
        "checkpoint": str(config.resume),
        "epoch": state["epoch"],
        "split": split,
        "num_samples": num_samples,
        "metrics": metrics,
        "per_class_accuracy": per_class_accuracy,
    }


if __name__ == "__main__":
    sys.exit(main())

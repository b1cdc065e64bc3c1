"""Evaluate a checkpoint on the test (or validation) split.

python test.py -r saved/models/<name>/<run_id>/model_best.pth [--split val] [--ema] [--json out.json]
"""

import argparse
import json
import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from base import StepOutput
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
        "--ema", action="store_true", help="evaluate the averaged weights (trainer.ema_decay)"
    )
    parser.add_argument(
        "--set", action="append", metavar="KEY.PATH=VALUE",
        help="override a config key, e.g. data_loader.args.data_dir=/data (repeatable)",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from parse_config import ConfigParser
    from utils import UserError
    from utils.device import gpu_indices

    try:
        if args.device is not None:  # before anything initialises CUDA (importing torch does not)
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu_indices(args.device)
        results = evaluate_checkpoint(ConfigParser.from_args(args), args.split, ema=args.ema)
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


def evaluate_checkpoint(config: "ConfigParser", split: str, *, ema: bool = False) -> dict:
    import torch

    from logger import setup_logging
    from utils import load_checkpoint, seed_everything
    from utils.build import build_trainer
    from utils.checkpoint import load_model_state
    from utils.device import run_device
    from utils.distributed import ProcessInfo

    setup_logging(None, verbosity=1)
    logger = logging.getLogger("test")
    seed_everything(config["seed"])
    device = run_device(config, logger, training=False)  # the run's, or --set device=...
    state = load_checkpoint(config.resume, map_location="cpu")
    # The run's own trainer, validation step, precision and memory format: --split val
    # reproduces the validation of the run.
    trainer = build_trainer(config, ProcessInfo(), device, logger, training=False)
    load_model_state(trainer.model, state, config.resume, ema=ema)
    class_names = trainer.data.class_names()
    hits = torch.zeros(2, len(class_names), dtype=torch.int64, device=device)

    def count_hits(result: "StepOutput") -> None:
        """[correct, total] per class, for classifiers (logits (B, C) and labels (B,))."""
        correct = result.output.argmax(dim=1) == result.target
        hits[0] += torch.bincount(result.target[correct], minlength=len(class_names))
        hits[1] += torch.bincount(result.target, minlength=len(class_names))

    observe = count_hits if class_names else None
    metrics = trainer.evaluate(trainer.data.eval_loader(split), split, observe=observe)
    num_samples = int(metrics.pop(f"{split}/num_samples"))
    correct, total = hits.tolist()
    per_class_accuracy = {
        name: (right / count if count else None)
        for name, right, count in zip(class_names, correct, total, strict=True)
    }
    weights = "averaged weights" if ema else "weights"
    logger.info(
        "%s: %d samples, %s of %s (epoch %d)",
        split,
        num_samples,
        weights,
        config.resume,
        state["epoch"],
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
        "ema": ema,
        "num_samples": num_samples,
        "metrics": metrics,
        "per_class_accuracy": per_class_accuracy,
    }


if __name__ == "__main__":
    sys.exit(main())

"""Evaluate a checkpoint on the test (or validation) split.

python test.py -r saved/models/<name>/<run_id>/model_best.pth [--split val] [--weights ema]
    [--json out.json] [--confusion-png matrix.png] [--force]
"""

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from PIL import Image

    from base.base_data_loader import BaseDataLoader
    from parse_config import ConfigParser

SCORES = ("recall", "precision", "f1")  # per class, printed in this order


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Evaluate a checkpoint.")
    parser.add_argument(
        "-r", "--resume", metavar="CKPT", required=True,
        help="checkpoint to evaluate (or a run folder: the newest of its timeline)",
    )  # fmt: skip
    parser.add_argument(
        "-c", "--config", help="config (default: config.json beside the checkpoint)"
    )
    parser.add_argument("-d", "--device", help="GPUs to use, e.g. 0 (sets CUDA_VISIBLE_DEVICES)")
    parser.add_argument("--split", choices=["test", "val"], default="test", help="default: test")
    parser.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
    parser.add_argument(
        "--confusion-png", metavar="PATH", help="classifiers: also draw the confusion matrix here"
    )
    parser.add_argument(
        "--force", action="store_true", help="let --json and --confusion-png replace files"
    )
    parser.add_argument(
        "--weights", choices=["auto", "trained", "ema"], default="auto",
        help="trained, ema (the averaged weights) or auto (the default: those the monitor judged)",
    )  # fmt: skip
    parser.add_argument(
        "--ema", dest="weights", action="store_const", const="ema", help="--weights ema"
    )
    parser.add_argument(
        "--allow-data-change", action="store_true",
        help="--split val on data other than the checkpoint's (refused by default)",
    )  # fmt: skip
    parser.add_argument(
        "--set", action="append", metavar="KEY.PATH=VALUE",
        help="override a config key, e.g. data_loader.args.data_dir=/data (repeatable)",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from parse_config import ConfigParser
    from utils import UserError
    from utils.distributed.device import gpu_indices
    from utils.distributed.process_group import process_info

    try:
        if args.device is not None:  # before anything initialises CUDA (importing torch does not)
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu_indices(args.device)
        outputs = output_paths(args)  # a bad path is refused before the work, not after it
        config = ConfigParser.from_args(args)
        results, image, global_step = evaluate_checkpoint(
            config, args.split, weights=args.weights, confusion_png=bool(args.confusion_png)
        )
        if args.confusion_png and image is None:  # before writing: exit 2 leaves the files be
            raise UserError(
                "--confusion-png: no confusion matrix (the data has no classes, the model's "
                "outputs are not class scores, or a label is no class nor ignore_index)"
            )
        if not process_info().is_main:  # under torchrun rank 0 alone writes and reports
            return 0
        write_outputs(outputs, results, image)
        if image is not None:  # last: a bad --json or --confusion-png path touches nothing
            tag = f"test.py/{args.split}_confusion_matrix" + ("_ema" if results["ema"] else "")
            log_to_tensorboard(config, tag, image, global_step)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def output_paths(args: argparse.Namespace) -> dict[str, Path]:
    """--json and --confusion-png as checked paths ({flag: path}); refused when one exists without
    --force (a report is not lost to a rerun), or both name one file (the image would replace it)."""
    from utils import UserError
    from utils.evaluation.predictions import writable_file

    named = {"--json": args.json, "--confusion-png": args.confusion_png}
    inputs = (args.resume, args.config)  # never replaced, even with --force
    paths = {flag: writable_file(flag, text, inputs) for flag, text in named.items() if text}
    if len(paths) == 2 and os.path.realpath(args.json) == os.path.realpath(args.confusion_png):
        raise UserError(f"--json and --confusion-png: both name {args.json}")
    for flag, path in paths.items():
        if path.exists() and not args.force:  # writable_file refused a folder already
            raise UserError(f"{flag} {path}: already exists; pass --force to replace it")
    return paths


def write_outputs(paths: dict[str, Path], results: dict, image: "Image.Image | None") -> None:
    """Write the report and the image where `paths` says, each atomically (a crash leaves the
    old file or the whole new one)."""
    from utils import UserError
    from utils.state.checkpoint import write_atomic
    from utils.util import json_text

    report = json_text(results).encode("utf-8")  # strict: a NaN metric as null
    writers = {
        "--json": lambda file: file.write(report),
        "--confusion-png": lambda file: image.save(file, format="PNG"),
    }
    for flag, path in paths.items():
        try:
            write_atomic(path, writers[flag])
        except OSError as error:
            raise UserError(f"{flag} {path}: cannot write ({error.strerror})") from None


def evaluate_checkpoint(
    config: "ConfigParser", split: str, *, weights: str = "auto", confusion_png: bool = False
) -> tuple[dict, "Image.Image | None", int]:
    """The results (as --json writes them), for classifiers the confusion matrix drawn, and the
    checkpoint's global step."""
    from logger import setup_logging
    from utils import seed_everything
    from utils.distributed.device import run_device, use_device
    from utils.distributed.process_group import barrier, process_group, process_info, said_by_rank0

    info = process_info()  # under torchrun the ranks share the split and rank 0 reports
    setup_logging(None, verbosity=1, rank=info.rank)
    logger = logging.getLogger("test")
    seed_everything(config["seed"])
    device = run_device(config, logger, info, training=False)  # the run's, or --set device=
    use_device(device)
    distributed = config["distributed"]
    # Under torchrun each rank evaluates its share of the split; the sums are all-reduced. Every
    # rank reads one checkpoint, config and data: their warnings (the data changed) said once.
    group = process_group(info, distributed["backend"], device, distributed["timeout"])
    with group, said_by_rank0((logger, logging.getLogger("data")), info.rank, verbosity=1):
        results = evaluate_in_group(
            config, split, device, weights=weights, confusion_png=confusion_png
        )
        barrier()  # leave together: none tears down the group in another's last collective
    return results


def evaluate_in_group(
    config: "ConfigParser", split: str, device: "torch.device", *, weights: str, confusion_png: bool
) -> tuple[dict, "Image.Image | None", int]:
    """evaluate_checkpoint's work, inside the process group (one of one without torchrun)."""
    from build import build_trainer, weights_note
    from utils import UserError
    from utils.distributed.process_group import process_info
    from utils.evaluation.confusion import ConfusionMatrix, confusion_results, draw_confusion_matrix
    from utils.evaluation.metric_sums import breakdown_table
    from utils.state.checkpoint import CheckpointError, load_checkpoint, use_averaged_weights
    from utils.state.model_state import load_model_state
    from utils.state.resume import data_change
    from utils.state.timeline import choose

    logger = logging.getLogger("test")
    path = config.resume
    if path.is_dir():  # a run folder: the newest checkpoint of its timeline that loads
        path = getattr(choose(path, logger), "path", None)
        if path is None:
            raise CheckpointError(f"{config.resume}: no checkpoint-epoch*.pth in this run folder")
    state = load_checkpoint(path, map_location="cpu")
    if confusion_png and not state.get("class_names", True):  # refused before evaluating
        raise UserError(
            "--confusion-png: the data has no classes (a regression?): no confusion matrix"
        )
    # The run's own trainer, validation step, precision and memory format: --split val
    # reproduces the validation of the run.
    trainer = build_trainer(config, process_info(), device, logger, training=False)
    check_names(state, trainer.data, path)
    # The validation split the run validated on? The test split, where the checkpoint kept it
    # (a table's, carved from the rows that trained: rows added would move some of those in)?
    saved = state.get("data")
    checked = saved is not None and (split == "val" or saved.get(split) is not None)
    current = trainer.data.fingerprint() if checked else {}
    if current.get(split) is not None:  # none: the data has no such split, said below
        change = data_change(saved, current, (split,))
        if change is not None and not config.allow_data_change:
            raise UserError(
                f"{path}: --split {split}: the data changed since this checkpoint ({change}); "
                "pass --allow-data-change to evaluate this data anyway"
            )
        if change is not None:
            logger.warning("%s: the data changed since this checkpoint (%s).", path, change)
    state["ema_chosen"] = ema = use_averaged_weights(state, weights)
    load_model_state(trainer.model, state, path, ema=ema)
    class_names = trainer.data.class_names()
    # Classifiers (logits (B, C), labels (B,)): exact counts[true class, predicted class].
    confusion = (
        ConfusionMatrix(len(class_names), device, trainer.data.ignore_index)
        if class_names
        else None
    )
    observe = confusion.add if confusion is not None else None
    loader = trainer.data.eval_loader(split)  # a split the data lacks is refused here
    check_inputs(trainer.model, trainer.data, split)
    metrics = trainer.evaluate(loader, split, observe=observe)
    num_samples = int(metrics.pop(f"{split}/num_samples"))
    if num_samples == 0:  # else a nan loss and exit 0 (e.g. a table with test_split 0)
        raise UserError(f"{path}: --split {split}: the data has no samples in that split")
    logger.info(
        "%s: %d samples, %s of %s (epoch %d)",
        *(split, num_samples, weights_note(state), path, state["epoch"]),
    )
    for key, value in metrics.items():
        if key.count("/") < 2:  # <split>/<metric>; <split>/<metric>/<class> in the table below
            logger.info("  %-20s %.4f", key, value)
    for line in breakdown_table(metrics):
        logger.info("  %s", line)
    results = {
        "checkpoint": str(path),
        "epoch": state["epoch"],
        "split": split,
        "ema": ema,
        "num_samples": num_samples,
        "metrics": metrics,
        "per_class_accuracy": {},
        "per_class": {},
        "confusion_matrix": None,
    }
    counts = confusion.all_ranks() if confusion is not None else None  # (C, C), all ranks'
    if counts is None:
        return results, None, state["global_step"]
    results.update(confusion_results(counts, class_names))
    for name, scores in results["per_class"].items():
        shown = ["n/a" if scores[key] is None else f"{scores[key]:.4f}" for key in SCORES]
        logger.info("  accuracy of %-10s %s  precision %s  F1 %s", name, *shown)
    return results, draw_confusion_matrix(counts, class_names), state["global_step"]


def check_inputs(model: "torch.nn.Module", data: "BaseDataLoader", split: str) -> None:
    """BaseModel.check_inputs on the inputs of `split` as the model sees them: one line for a
    token outside a GRU's vocabulary, not an IndexError from its forward pass."""
    check = getattr(model, "check_inputs", None)  # a torchvision model has none
    if check is not None:
        source = data.validation_source() if split == "val" else None
        name, indices = source or (split, range(len(data.dataset(split))))
        view = data.view(name, augment=False)
        check((view[int(index)][0] for index in indices), data.location(name))


def check_names(state: dict, data: "BaseDataLoader", path: Path) -> None:
    """Refuse data whose feature columns or classes are not the model's, in its order: a table's
    loader reads its columns in the file's order and numbers its classes by their sorted label
    values, so an edited file would be scored against other inputs or other classes. A list the
    checkpoint lacks (one from before it was kept) is not checked."""
    from utils import UserError

    for key, what, current in (
        ("feature_names", "feature columns", data.feature_names()),
        ("class_names", "classes", data.class_names()),
    ):
        saved = state.get(key)
        if saved is not None and list(current) != list(saved):
            raise UserError(
                f"{path}: the data's {what} ({listed(current)}) are not the model's, in the "
                f"order it trained on ({listed(saved)})"
            )


def listed(names: list, most: int = 10) -> str:
    """names, comma-separated, the first `most` of a longer list (ImageNet's 1000 classes)."""
    shown = ", ".join(map(str, names[:most]))
    return shown if len(names) <= most else f"{shown}, ... ({len(names)} in all)"


def log_to_tensorboard(config: "ConfigParser", tag: str, image: "Image.Image", step: int) -> None:
    """Add the image to the run's TensorBoard logs, when the run keeps them (and they are
    writable: a read-only copy of a run is evaluated all the same)."""
    from logger import TensorboardLogger, selected_loggers
    from utils.evaluation.confusion import image_tensor

    keeps_logs = config.log_dir.is_dir() and os.access(config.log_dir, os.W_OK)
    if "tensorboard" in selected_loggers(config["trainer"]) and keeps_logs:
        writer = TensorboardLogger(config.log_dir)
        writer.log_image(tag, image_tensor(image), step)
        writer.close(finished=True)
        logging.getLogger("test").info("TensorBoard: %s in %s", tag, config.log_dir)


if __name__ == "__main__":
    exit_code = main()
    from utils.util import freeze_heap_for_exit  # imported by main() already

    freeze_heap_for_exit()
    sys.exit(exit_code)

"""Predict with a checkpoint alone (no config file, no training data): the classes of images,
or for other data the outputs of each row its loader reads (e.g. CSV files for tabular data).

python predict.py -r saved/models/<name>/<run_id>/model_best.pth photos/ cat.jpg 'more/*.png'
python predict.py -r saved/models/Diabetes_MLP/<run_id>/model_best.pth new_patients.csv
"""

import argparse
import csv
import glob
import io
import json
import os
import sys
from pathlib import Path


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Predict the classes of images.")
    add = parser.add_argument
    # fmt: off
    add("-r", "--resume", metavar="CKPT", required=True, help="checkpoint to predict with")
    add("inputs", nargs="+", metavar="INPUT",
        help="an image file, a folder (searched recursively for images) or a glob; for other "
        "data, a file its loader reads (tabular data: a CSV file, a row per sample)")
    add("--top-k", type=positive_int, default=5, metavar="K", help="classes per image (default 5)")
    add("--out", metavar="FILE", help="also write one row per image to FILE.csv or FILE.json")
    add("--force", action="store_true", help="let --out replace an existing file")
    add("--batch-size", type=positive_int, default=64, metavar="N", help="default: 64")
    add("--weights", choices=["auto", "trained", "ema"], default="auto",
        help="trained, ema (the averaged weights) or auto (the default): those the run's "
        "monitor judged")
    add("--ema", dest="weights", action="store_const", const="ema", help="--weights ema")
    add("-d", "--device", help="GPUs to use, e.g. 0 (sets CUDA_VISIBLE_DEVICES)")
    # fmt: on
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from utils import UserError
    from utils.distributed.device import gpu_indices
    from utils.state.checkpoint import write_text_atomic

    try:
        if args.device is not None:  # before anything initialises CUDA (importing torch does not)
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu_indices(args.device)
        out = output_path(args.out, args.force)  # refused before the work, not after it
        rows, num_inputs = predict(args)
        if out is not None:
            try:
                write_text_atomic(out, format_rows(rows, out.suffix.lower()))
            except OSError as error:
                raise UserError(f"--out {out}: cannot write ({error.strerror})") from None
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if len(rows) < num_inputs:
        print(
            f"error: {num_inputs - len(rows)} of {num_inputs} files could not be read (named "
            "above); the others were predicted",
            file=sys.stderr,
        )
        return 1
    return 0


def output_path(out: str | None, force: bool) -> Path | None:
    from utils import UserError

    if out is None:
        return None
    path = Path(out)
    if path.suffix.lower() not in (".csv", ".json"):
        raise UserError(f"--out {out}: must end in .csv or .json")
    if path.exists() and not force:
        raise UserError(f"--out {out}: already exists; pass --force to replace it")
    if not path.parent.is_dir():
        raise UserError(f"--out {out}: folder {path.parent} not found")
    return path


def image_paths(inputs: list[str]) -> list[Path]:
    """The files INPUTs name, sorted by path: files as given, folders searched recursively for
    image files (by extension), globs expanded (recursively with **)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    from utils import UserError

    found: set[Path] = set()
    for text in inputs:
        if os.path.lexists(text):
            named = [Path(text)]
        else:
            named = [Path(match) for match in glob.glob(text, recursive=True)]
        if not named:
            kind = "matches no file" if glob.has_magic(text) else "no such file or folder"
            raise UserError(f"{text}: {kind}")
        files = [path for path in named if not path.is_dir()]
        for folder in (path for path in named if path.is_dir()):
            files += [
                path
                for path in folder.rglob("*")
                if path.suffix.lower() in IMG_EXTENSIONS and path.is_file()
            ]
        if not files:
            raise UserError(f"{text}: no image files ({', '.join(IMG_EXTENSIONS)}) in it")
        found.update(files)
    # By path components, as ImageFolder orders its samples (class folder, then file name).
    return sorted(found, key=lambda path: path.parts)


def predict(args: argparse.Namespace) -> tuple[list[dict], int]:
    """(one row per prediction, the number of inputs): images, or the rows the checkpoint's
    data loader reads from each input (its classmethod read_inputs)."""
    import data_loader.data_loaders as data_module
    from build import load_inference_model, weights_note

    model, config, state = load_inference_model(Path(args.resume), weights=args.weights)
    if state.get("ema"):  # a choice was made: say which (stdout holds the predictions)
        print(f"{args.resume}: {weights_note(state)}", file=sys.stderr)
    section = config["data_loader"]
    loader_class = config.lookup(data_module, section["type"], "data_loader.type")
    if hasattr(loader_class, "read_inputs"):
        return predict_rows(args, model, config, state, loader_class), len(args.inputs)
    paths = image_paths(args.inputs)
    return predict_images(args, paths, model, config, state), len(paths)


def predict_rows(
    args: argparse.Namespace, model: object, config: object, state: dict, loader_class: type
) -> list[dict]:
    """For data that is not images: the rows loader_class.read_inputs reads from each input,
    through the model; a classifier's top-k classes, else the output values of each row."""
    import torch

    from utils import UserError

    rows: list[dict] = []
    # The training data's input columns, which the inputs are read by (None: an older checkpoint).
    columns = state.get("feature_names")
    if columns is None:
        note = "no feature names (an older checkpoint): columns are read by position"
        print(f"warning: {args.resume}: {note}", file=sys.stderr)
    for text in args.inputs:
        names, inputs = loader_class.read_inputs(Path(text), config["data_loader"]["args"], columns)
        with torch.inference_mode():
            outputs = torch.cat(
                [
                    model(inputs[i : i + args.batch_size])
                    for i in range(0, len(inputs), args.batch_size)
                ]
            )
        # A classifier's names, one per output (or indices, with a warning, when they disagree).
        named = bool(state.get("class_names"))
        classes = class_labels(state, outputs.shape[1], args.resume) if named else []
        for name, output in zip(names, outputs.float(), strict=True):
            if classes:
                top = output.softmax(dim=0).topk(min(args.top_k, len(classes)))
                labels = [classes[index] for index in top.indices.tolist()]
                rows.append({"path": name, "labels": labels, "probabilities": top.values.tolist()})
                shown = "  ".join(
                    f"{k} {v:.4f}" for k, v in zip(labels, top.values.tolist(), strict=True)
                )
            else:
                rows.append({"path": name, "values": output.reshape(-1).tolist()})
                shown = "  ".join(f"{value:.6g}" for value in output.reshape(-1).tolist())
            print(f"{name}  {shown}")
    if not rows:
        raise UserError(f"{', '.join(args.inputs)}: no rows to predict")
    return rows


def predict_images(
    args: argparse.Namespace, paths: list[Path], model: object, config: object, state: dict
) -> list[dict]:
    """One row {"path", "labels", "probabilities"} per readable image, in the order of `paths`;
    each row is printed as it comes and each unreadable file reported on stderr."""
    import logging

    import torch
    from tqdm import tqdm

    from base.base_data_loader import DataError
    from build import input_transform
    from data_loader.data_loaders import load_image
    from utils import UserError, amp_dtype
    from utils.data.batches import to_device
    from utils.distributed.device import capabilities, select_device

    transform = input_transform(config)
    # The device of this machine ("auto" with the run's n_gpu, whatever device the run named:
    # a checkpoint predicts anywhere); the run's autocast precision where it runs here, and
    # its memory format.
    options = config["trainer"]
    device = select_device("auto", config["n_gpu"], logging.getLogger("predict"))
    model = model.to(device)
    if options["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    dtype = amp_dtype(options["amp"] if options["amp"] in capabilities(device).autocast else None)
    rows: list[dict] = []
    labels: list[str] = []
    # Drawn only on a terminal and for more than one batch; rows go to stdout around it.
    long = len(paths) > args.batch_size
    progress = tqdm(total=len(paths), unit="image", disable=None if long else True)
    for start in range(0, len(paths), args.batch_size):
        images, readable = [], []
        for path in paths[start : start + args.batch_size]:
            try:
                images.append(transform(load_image(str(path))))
                readable.append(path)
            except DataError as error:  # reported and skipped: the other images go on
                progress.write(f"error: {error}", file=sys.stderr)
        progress.update(len(paths[start : start + args.batch_size]))
        if not images:
            continue
        batch = to_device(torch.stack(images), device, options["channels_last"])  # (B, C, H, W)
        with torch.inference_mode(), torch.autocast(device.type, dtype, dtype is not None):
            logits = model(batch)
        if logits.dim() != 2:
            raise UserError(
                f"{args.resume}: predict.py is for classifiers (logits of shape (batch, classes)); "
                f"this model returns shape {tuple(logits.shape)}"
            )
        labels = labels or class_labels(state, logits.shape[1], args.resume)
        top = logits.float().softmax(dim=1).topk(min(args.top_k, logits.shape[1]), dim=1)
        for path, values, indices in zip(
            readable, top.values.tolist(), top.indices.tolist(), strict=True
        ):
            names = [labels[index] for index in indices]
            rows.append({"path": str(path), "labels": names, "probabilities": values})
            pairs = zip(names, values, strict=True)
            shown = "  ".join(f"{name} {value:.4f}" for name, value in pairs)
            progress.write(f"{path}  {shown}", file=sys.stdout)
    progress.close()
    return rows


def class_labels(state: dict, num_classes: int, path: str) -> list[str]:
    """The checkpoint's class names; for older checkpoints (none saved), class indices."""
    names = state.get("class_names") or []
    if len(names) == num_classes:
        return list(names)
    found = f"{len(names)} class names" if names else "no class names (an older checkpoint)"
    print(
        f"warning: {path}: {found} for {num_classes} outputs; labels are class indices",
        file=sys.stderr,
    )
    return [str(index) for index in range(num_classes)]


def format_rows(rows: list[dict], suffix: str) -> str:
    """JSON: the rows as they are; CSV: path, label_1, probability_1, label_2, ... (or for
    outputs that are not classes, path, value_1, value_2, ...)"""
    if suffix == ".json":
        return json.dumps(rows, indent=2) + "\n"
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if rows and "values" in rows[0]:
        width = max(len(row["values"]) for row in rows)
        writer.writerow(["path", *(f"value_{k}" for k in range(1, width + 1))])
        writer.writerows([row["path"], *row["values"]] for row in rows)
        return buffer.getvalue()
    num_top = max((len(row["labels"]) for row in rows), default=0)
    ranks = range(1, num_top + 1)
    writer.writerow(["path", *(f"{name}_{k}" for k in ranks for name in ("label", "probability"))])
    for row in rows:
        pairs = zip(row["labels"], row["probabilities"], strict=True)
        writer.writerow([row["path"], *(item for pair in pairs for item in pair)])
    return buffer.getvalue()


if __name__ == "__main__":
    sys.exit(main())

"""Predict with a checkpoint alone (no config file, no training data): the classes of images,
or for other data the outputs of each row its loader reads (e.g. CSV files for tabular data),
or the rows (and files, in --out-dir) of the loader's prediction_rows (e.g. mask PNGs).

python predict.py -r saved/models/<name>/<run_id>/model_best.pth photos/ cat.jpg 'more/*.png'
python predict.py -r saved/models/Diabetes_MLP/<run_id>/model_best.pth new_patients.csv
python predict.py -r saved/models/Segment_Shapes/<run_id>/model_best.pth images/ --out-dir masks
"""

import argparse
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
    add("--out-dir", metavar="DIR", help="a folder (made if missing) for the files a task writes "
        "per input, e.g. a segmenter's mask PNGs (loaders with prediction_rows)")
    add("--force", action="store_true", help="let --out and --out-dir replace files (not inputs)")
    add("--batch-size", type=positive_int, default=64, metavar="N", help="default: 64")
    add("--weights", choices=["auto", "trained", "ema"], default="auto", help="trained, ema (the "
        "averaged weights) or auto (the default): those the run's monitor judged")
    add("--ema", dest="weights", action="store_const", const="ema", help="--weights ema")
    add("-d", "--device", help="GPUs to use, e.g. 0 (sets CUDA_VISIBLE_DEVICES)")
    # fmt: on
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from utils import UserError
    from utils.distributed.device import gpu_indices
    from utils.distributed.process_group import one_process
    from utils.evaluation.predictions import format_rows, output_path
    from utils.state.checkpoint import write_text_atomic

    try:
        one_process("predict.py", "print every row and write --out")
        if args.device is not None:  # before anything initialises CUDA (importing torch does not)
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu_indices(args.device)
        # Refused before the work, not after it; never the checkpoint, even with --force.
        out = output_path(args.out, args.force, [args.resume])
        rows, num_inputs, flat = predict(args, out)
        if out is not None:
            try:
                write_text_atomic(out, format_rows(rows, out.suffix.lower(), flat=flat))
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


def predict(args: argparse.Namespace, out: Path | None) -> tuple[list[dict], int, bool]:
    """(one row per prediction, the number of inputs, whether the rows are the loader's own
    flat rows): images, or the rows the checkpoint's data loader reads from each input (its
    classmethod read_inputs); through its classmethod prediction_rows when it has one. Every
    input is read and every file to write checked before the first is written."""
    import data_loader.data_loaders as data_module
    from build import load_inference_model, weights_note
    from utils.evaluation.predictions import check_outputs, image_paths, output_folder
    from utils.evaluation.tta import as_evaluated

    model, config, state = load_inference_model(Path(args.resume), weights=args.weights)
    if state.get("ema"):  # a choice was made: say which (stdout holds the predictions)
        print(f"{args.resume}: {weights_note(state)}", file=sys.stderr)
    section = config["data_loader"]
    loader_class = config.lookup(data_module, section["type"], "data_loader.type")
    # A loader's own rows (prediction_rows): printed and written as they come, flat.
    flat = hasattr(loader_class, "prediction_rows")
    out_dir = output_folder(args.out_dir, loader_class)
    if hasattr(loader_class, "read_inputs"):
        columns = state.get("feature_names")  # None: an older checkpoint
        if columns is None and not flat:
            note = "no feature names (an older checkpoint): columns are read by position"
            print(f"warning: {args.resume}: {note}", file=sys.stderr)
        section = config["data_loader"]["args"]
        read = [loader_class.read_inputs(Path(text), section, columns) for text in args.inputs]
        # The model's check (BaseModel.check_inputs) of every file before the first prediction:
        # one line for a token outside a GRU's vocabulary, not an IndexError from its forward.
        check = getattr(model, "check_inputs", None)  # a torchvision model has none
        for text, (_, inputs) in zip(args.inputs, read, strict=True):
            if check is not None:
                check(inputs, text)
        names = [name for batch_names, _ in read for name in batch_names]
    else:
        paths = image_paths(args.inputs)
        names = [str(path) for path in paths]
    planned = []  # (an input's name, a file its prediction_rows writes in out_dir)
    if out_dir is not None:
        files = loader_class.prediction_files
        planned = [(name, out_dir / file) for name in names for file in files(name)]
    check_outputs(planned, args.inputs, out=out, force=args.force)
    if out_dir is not None:
        out_dir.mkdir(exist_ok=True)
    # The model test.py scores: averaged over the run's test-time augmentation views (tta_*).
    model = as_evaluated(model, config["trainer"])
    if hasattr(loader_class, "read_inputs"):
        return predict_rows(args, model, state, loader_class, read, out_dir), len(args.inputs), flat
    if flat:  # images through the run's evaluation transform, then the loader's rows
        from build import input_transform
        from data_loader.data_loaders import load_image
        from utils.evaluation.predictions import hooked_rows

        inputs = [input_transform(config)(load_image(str(path))) for path in paths]
        rows = hooked_rows(model, state, loader_class, names, inputs, args.batch_size, out_dir)
        return rows, len(paths), flat
    return predict_images(args, paths, model, config, state), len(paths), flat


def predict_rows(
    args: argparse.Namespace,
    model: object,
    state: dict,
    loader_class: type,
    read: list[tuple[list[str], object]],
    out_dir: Path | None,
) -> list[dict]:
    """The rows of what loader_class.read_inputs read from each input (read: its (names,
    inputs) per input), through the model: the rows of its prediction_rows when it has one
    (then read_inputs may give a list of inputs of any shapes, e.g. images of several sizes),
    else a classifier's top-k classes, else the output values of each row."""
    import torch

    from utils import UserError
    from utils.evaluation.predictions import class_labels, hooked_rows

    rows: list[dict] = []
    flat = hasattr(loader_class, "prediction_rows")
    for names, inputs in read:
        if flat:
            inputs = list(inputs)
            rows += hooked_rows(model, state, loader_class, names, inputs, args.batch_size, out_dir)
            continue
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
                # In full: each float32's shortest decimal that reads back as it (not 6 digits)
                shown = "  ".join(str(value) for value in output.reshape(-1).cpu().numpy())
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
    from utils.evaluation.predictions import class_labels

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


if __name__ == "__main__":
    sys.exit(main())

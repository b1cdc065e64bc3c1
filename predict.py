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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO


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


# Rows of a CSV file read at a time (a loader's read_input_chunks): what predict.py holds of an
# input of millions of rows, with one batch of its outputs.
CHUNK_ROWS = 65536


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from utils import UserError
    from utils.distributed.device import gpu_indices
    from utils.distributed.process_group import one_process
    from utils.evaluation.predictions import output_path

    try:
        one_process("predict.py", "print every row and write --out")
        if args.device is not None:  # before anything initialises CUDA (importing torch does not)
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu_indices(args.device)
        # Refused before the work, not after it; never the checkpoint, even with --force.
        out = output_path(args.out, args.force, [args.resume])
        num_unread, num_inputs = predict(args, out)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if num_unread:
        print(
            f"error: {num_unread} of {num_inputs} files could not be read (named above); the "
            "others were predicted",
            file=sys.stderr,
        )
        return 1
    return 0


def predict(args: argparse.Namespace, out: Path | None) -> tuple[int, int]:
    """(the number of inputs that could not be read, of how many) once every row is printed
    and written to `out`: images, or the rows the checkpoint's data loader reads from each
    input (its classmethods read_input_chunks or read_inputs); through its classmethod
    prediction_rows when it has one. Every input is read and every file to write checked
    before the first is written."""
    import data_loader.data_loaders as data_module
    from build import load_inference_model, weights_note
    from utils import UserError
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
        sources = [input_source(loader_class, Path(text), section, columns) for text in args.inputs]
        # Every row of every input read and checked before the first prediction (a bad row at
        # the end of a long file is one line, and --out stays as it was), by the model's check
        # (BaseModel.check_inputs) too: a token outside a GRU's vocabulary is one line, not an
        # IndexError from its forward.
        check = getattr(model, "check_inputs", None)  # a torchvision model has none
        names = []
        for text, source in zip(args.inputs, sources, strict=True):
            for chunk_names, inputs in source():
                if check is not None:
                    check(inputs, text)
                names += chunk_names if out_dir is not None else []
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
    if flat:  # a loader's own rows, of its inputs or of images through the evaluation transform
        from build import input_transform
        from data_loader.data_loaders import load_image
        from utils.evaluation.predictions import hooked_rows

        if hasattr(loader_class, "read_inputs"):
            read = [
                (chunk_names, list(inputs))
                for source in sources
                for chunk_names, inputs in source()
            ]
        else:
            read = [(names, [input_transform(config)(load_image(name)) for name in names])]
        rows = [
            row
            for chunk_names, inputs in read
            for row in hooked_rows(
                model, state, loader_class, chunk_names, inputs, args.batch_size, out_dir
            )
        ]
        if not rows:
            raise UserError(f"{', '.join(args.inputs)}: no rows to predict")
        write_out(out, lambda stream: stream and stream.write(rows), flat=True)
        return 0, len(args.inputs)
    if hasattr(loader_class, "read_inputs"):
        from utils.evaluation.row_stream import predict_rows

        files = (source() for source in sources)  # each read again, a chunk at a time
        write_out(out, lambda stream: predict_rows(args, model, state, files, stream))
        return 0, len(args.inputs)
    produce = lambda stream: predict_images(args, paths, model, config, state, stream)  # noqa: E731
    num_rows = write_out(out, produce)
    return len(paths) - num_rows, len(paths)


def input_source(
    loader_class: type, path: Path, args: dict, columns: list[str] | None
) -> Callable[[], Iterable[tuple[list[str], Any]]]:
    """The chunks (names, inputs) of one input, each time they are asked for: read again, a
    chunk at a time, by a loader with read_input_chunks (a table of millions of rows), else read
    once, whole, by read_inputs and kept. A pipe (/dev/stdin, <(zcat rows.csv.gz)) is read once:
    a second read would find it empty."""
    if hasattr(loader_class, "read_input_chunks") and path.is_file():
        return lambda: loader_class.read_input_chunks(path, args, columns, CHUNK_ROWS)
    read = [loader_class.read_inputs(path, args, columns)]
    return lambda: read


def write_out(out: Path | None, produce: Callable[[Any], Any], *, flat: bool = False) -> Any:
    """What produce(stream) returns, the rows it gives `stream` (a RowStream; None without
    --out) written to --out atomically: under a temporary name, renamed onto `out` once every
    row is written, so that an error on the way leaves the file as it was. flat: a loader's
    own rows (format_rows' flat=True)."""
    from utils import UserError
    from utils.evaluation.row_stream import RowStream
    from utils.state.checkpoint import write_atomic

    if out is None:
        return produce(None)
    produced = []

    def write(file: BinaryIO) -> None:
        stream = RowStream(file, out.suffix.lower(), flat=flat)
        produced.append(produce(stream))
        stream.finish()

    try:
        write_atomic(out, write)
    except OSError as error:
        raise UserError(f"--out {out}: cannot write ({error.strerror})") from None
    return produced[0]


def predict_images(
    args: argparse.Namespace,
    paths: list[Path],
    model: object,
    config: object,
    state: dict,
    stream: Any = None,
) -> int:
    """The number of readable images, of `paths`: one row {"path", "labels", "probabilities"}
    each, in their order, printed and written to `stream` (a RowStream) as its batch comes;
    each unreadable file reported on stderr."""
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
    num_rows = 0
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
        rows = []
        for path, values, indices in zip(
            readable, top.values.tolist(), top.indices.tolist(), strict=True
        ):
            names = [labels[index] for index in indices]
            rows.append({"path": str(path), "labels": names, "probabilities": values})
            pairs = zip(names, values, strict=True)
            shown = "  ".join(f"{name} {value:.4f}" for name, value in pairs)
            progress.write(f"{path}  {shown}", file=sys.stdout)
        if stream is not None:
            stream.write(rows)
        num_rows += len(rows)
    progress.close()
    return num_rows


if __name__ == "__main__":
    sys.exit(main())

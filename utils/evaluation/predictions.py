"""predict.py's files and names: where its rows go (--out, --out-dir), which files its inputs
name, the class names of a checkpoint, a loader's own rows (hooked_rows), and the rows as CSV or
JSON; the checks of an output file that test.py shares."""

import csv
import glob
import io
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from utils.util import IMAGE_EXTENSIONS, UserError, describe_error, json_text, warn_unread_images

# A run's own files, by name (utils/state/checkpoint.py, run_folder.py, logger/): no command's
# output replaces one, even with --force, since a report written over a checkpoint, config.json
# or a log would lose the run. These wherever they lie; RUN_FOLDER_FILES, names a report may
# also have (result.json), only in a run's folder (it holds config.json) or log folder (info.log).
RUN_FILES = (
    *("*.pth", "config.json", "folds_summary.json", "events.out.tfevents.*", "mlflow.db"),
    *(".wandb-sent.json", ".mlflow-sent.json"),
)
RUN_FOLDER_FILES = ("latest", ".lock", "result.json", "info.log", "metrics.csv", "steps.csv")


def is_run_file(path: Path) -> bool:
    """`path` (or the file it links to) is, or would be taken for, one of a run's own files."""
    for file in (path, path.resolve()):
        in_run = any((file.parent / name).is_file() for name in ("config.json", "info.log"))
        names = RUN_FILES + RUN_FOLDER_FILES if in_run else RUN_FILES
        if any(file.match(name) for name in names):
            return True
    return False


def writable_file(flag: str, text: str, inputs: Sequence[str | None] = ()) -> Path:
    """The file a flag names, checked before any work so that a bad path is refused before
    anything is written: not a folder, in a folder that exists and that this process may
    write in (files are written atomically: a new file there, renamed onto the name), and not
    a run's file (is_run_file) nor one of `inputs` (the checkpoint, the config read)."""
    path = Path(text)
    if path.is_dir():
        raise UserError(f"{flag} {text}: is a folder")
    if not path.parent.is_dir():
        raise UserError(f"{flag} {text}: folder {path.parent} not found")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {text}: folder {path.parent} is not writable")
    if is_run_file(path):  # also one not written yet: a fold's result.json, say
        raise UserError(
            f"{flag} {text}: names a run's file (a checkpoint, config.json or log); it is not "
            "written, even with --force: name another file"
        )
    read = [Path(name) for name in inputs if name is not None]
    if path.is_file() and any(file.is_file() and path.samefile(file) for file in read):
        raise UserError(f"{flag} {text}: is an input; it is not replaced, even with --force")
    return path


def output_path(out: str | None, force: bool, inputs: Sequence[str | None] = ()) -> Path | None:
    """--out as a path to write, checked before any work: a .csv or .json file in a folder
    that exists, not a run's file nor one of `inputs`, and not an existing file unless --force."""
    if out is None:
        return None
    if Path(out).suffix.lower() not in (".csv", ".json"):
        raise UserError(f"--out {out}: must end in .csv or .json")
    path = writable_file("--out", out, inputs)
    if path.exists() and not force:
        raise UserError(f"--out {out}: already exists; pass --force to replace it")
    return path


def output_folder(out_dir: str | None, loader_class: type) -> Path | None:
    """--out-dir as a folder, checked (made later, by check_outputs' caller, once every check
    has passed); refused where the loader declares no files per input (prediction_files)."""
    if out_dir is None:
        return None
    if not hasattr(loader_class, "prediction_files"):
        raise UserError(
            f"--out-dir {out_dir}: this checkpoint's data loader writes no files per input "
            "(it has no prediction_files)"
        )
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise UserError(f"--out-dir {out_dir}: not a folder")
    if not path.parent.is_dir():
        raise UserError(f"--out-dir {out_dir}: folder {path.parent} not found")
    return path


def check_outputs(
    planned: list[tuple[str, Path]], inputs: list[str], *, out: Path | None, force: bool
) -> None:
    """Refuse, before anything is written, a run whose files (planned: (input name, a file
    prediction_rows writes for it in --out-dir); --out) would replace one of the inputs (even
    with --force: they are the user's data), an existing file without --force, or each other
    (two inputs of one mask name: the second would replace the first's)."""
    read = [Path(text) for text in inputs] + [Path(name) for name, _ in planned]
    input_files = {file_id(path) for path in read if path.is_file()}
    writers: dict[str, str] = {}  # a planned file (normalised) -> the input it is written for
    existing = []
    for name, path in planned:
        key = os.path.normcase(os.path.abspath(path))
        if writers.get(key, name) != name:
            raise UserError(
                f"--out-dir: {writers[key]} and {name} would both write {path}; predict them "
                "into separate folders"
            )
        writers[key] = name
        if path.is_file() and file_id(path) in input_files:
            raise UserError(
                f"--out-dir: {path} is an input; it is not replaced, even with --force: pass "
                "another --out-dir"
            )
        if os.path.lexists(path):
            existing.append(path)
    if existing and not force:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise UserError(f"--out-dir: {existing[0]}{more} already exists; pass --force to replace")
    if out is not None and os.path.normcase(os.path.abspath(out)) in writers:
        raise UserError(f"--out {out}: also a file --out-dir writes; name another file")
    if out is not None and out.is_file() and file_id(out) in input_files:
        raise UserError(f"--out {out}: is an input; it is not replaced, even with --force")


def file_id(path: Path) -> tuple[int, int]:
    """(device, inode): one file under any of its names (links, ./, another case)."""
    status = path.stat()
    return status.st_dev, status.st_ino


def image_paths(inputs: list[str]) -> list[Path]:
    """The files INPUTs name, sorted by path: files as given, folders searched recursively for
    image files (by extension; hidden ones left out), globs expanded (recursively with **)."""
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
            # Not hidden ones (macOS's ._<name> beside each copied file, .ipynb_checkpoints/).
            visible = [
                path
                for path in folder.rglob("*")
                if path.is_file()
                and not any(part[0] == "." for part in path.relative_to(folder).parts)
            ]
            warn_unread_images(folder, visible, logging.getLogger("predict"))
            files += [path for path in visible if path.suffix.lower() in IMAGE_EXTENSIONS]
        if not files:
            raise UserError(f"{text}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in it")
        found.update(files)
    # By path components, as ImageFolder orders its samples (class folder, then file name).
    return sorted(found, key=lambda path: path.parts)


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


def format_rows(rows: list[dict], suffix: str, *, flat: bool = False) -> str:
    """JSON: the rows as they are; CSV: path, label_1, probability_1, label_2, ... (or for
    outputs that are not classes, path, value_1, value_2, ...; flat rows of a loader's
    prediction_rows: the union of their keys, in order of appearance)"""
    if suffix == ".json":
        return json_text(rows, indent=2)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if flat:
        columns = list(dict.fromkeys(key for row in rows for key in row))
        writer.writerow(columns)
        writer.writerows([row.get(column, "") for column in columns] for row in rows)
        return buffer.getvalue()
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


def hooked_rows(
    model: object,
    state: dict,
    loader_class: type,
    names: list[str],
    inputs: list,
    batch_size: int,
    out_dir: Path | None,
) -> list[dict]:
    """loader_class.prediction_rows of `inputs` (each (C, ...)) with the model's raw outputs on
    the CPU, in batches of consecutive inputs of one shape (at most batch_size); each row printed.
    An input the model refuses (a U-Net's size its stride does not divide) is a UserError."""
    import torch

    rows: list[dict] = []
    start = 0
    while start < len(inputs):
        end = start + 1  # the run of inputs of the first one's shape, up to a batch
        while (
            end < len(inputs)
            and end - start < batch_size
            and inputs[end].shape == inputs[start].shape
        ):
            end += 1
        batch = torch.stack(inputs[start:end])
        try:
            with torch.inference_mode():
                outputs = model(batch)
        except (RuntimeError, ValueError) as error:  # what does not fit, as train.py's check
            raise UserError(
                f"{names[start]}: the model refuses inputs {tuple(batch.shape[1:])}: "
                f"{describe_error(error)}"
            ) from None
        if isinstance(outputs, torch.Tensor):  # logits; else as the model gives them (detections)
            outputs = outputs.float()
        batch_rows = loader_class.prediction_rows(
            names[start:end],
            outputs,
            class_names=list(state.get("class_names") or []),
            out_dir=out_dir,
        )
        for row in batch_rows:
            print("  ".join(str(value) for value in row.values()))
        rows += batch_rows
        start = end
    return rows

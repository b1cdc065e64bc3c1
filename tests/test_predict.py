"""predict.py: classes of images from a checkpoint alone, the same as test.py computes, and one
"error:" line for each bad input. Real images: ../shared/data/cifar10-sample (skipped if absent).

One flow runs the real predict.py as a subprocess (folders and globs, as CSV); the others, and
the train.py and test.py runs they need, call main in-process (conftest's run_main, or
predict.main for the bad-input cases): a new interpreter spends seconds importing torch. The
checkpoints come from real train.py runs (conftest's demo_checkpoint).
"""

import csv
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import ENTRY_POINTS, NO_SAMPLE, ROOT, SAMPLE_DIR, run_main, run_script, write_shrunk
from PIL import Image

import predict
from base.evaluation import averaged_over_views
from build import input_transform, load_inference_model
from data_loader.image_files import load_image
from data_loader.synthetic import SyntheticShapes
from data_loader.tasks.sequences import write_sequences
from utils.evaluation.predictions import image_paths

CLASSES = list(SyntheticShapes.classes)


def write_images(folder: Path, names: list[str], seed: int = 0) -> list[Path]:
    """Random 32x32 RGB images at folder/<name> (subfolders made as needed)."""
    rng = np.random.default_rng(seed)
    paths = []
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), np.uint8)).save(path)
        paths.append(path)
    return paths


def edited_checkpoint(source: Path, target: Path, edit) -> Path:
    """A copy of checkpoint `source` at `target`, changed by edit(state)."""
    state = torch.load(source, weights_only=True)
    edit(state)
    torch.save(state, target)
    return target


@pytest.mark.parametrize("preset", ["cifar", "imagenet"])
def test_the_transform_from_the_config_alone_is_the_loaders(tmp_path, preset):
    from data_loader.data_loaders import ImageFolderDataLoader
    from data_loader.transforms import evaluation_transform

    (tmp_path / "train").mkdir()
    args = {"data_dir": str(tmp_path), "preset": preset, "image_size": 40, "batch_size": 8}
    loader = ImageFolderDataLoader(**args, seed=0)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 70, 3), np.uint8))
    rebuilt = evaluation_transform(ImageFolderDataLoader, {**args, "data_dir": "nowhere"})(image)
    assert rebuilt.shape == (3, 40, 40) and torch.equal(rebuilt, loader.transform(False)(image))


def test_checkpoints_carry_the_class_names(demo_checkpoint):
    assert torch.load(demo_checkpoint, weights_only=True)["class_names"] == CLASSES


def test_a_folders_jfif_photos_are_read_and_heic_ones_counted_in_a_warning(tmp_path, caplog):
    # .jfif and .jpe are JPEGs: they were left out of a folder without a word, as .heic ones.
    read = write_images(tmp_path, ["a.jfif", "b.JPE", "c.png"])
    (tmp_path / "d.heic").write_bytes(b"a phone photo PIL does not read")
    (tmp_path / "notes.txt").write_text("not an image")
    assert image_paths([str(tmp_path)]) == read
    assert f"{tmp_path}: left out 1 image files of a format not read (1 .heic)" in caplog.text


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_folders_and_globs_in_path_order_as_csv_and_json(demo_checkpoint, tmp_path):
    images = tmp_path / "images"
    write_images(images, ["b/2.png", "b/10.jpg", "a/z.png", "a/deep/x.bmp"])
    (images / "a" / "notes.txt").write_text("not an image, and not looked at in a folder")
    write_images(tmp_path, ["single.png", "globbed/1.png", "globbed/2.png"], seed=1)
    inputs = [str(images), str(tmp_path / "single.png"), str(tmp_path / "globbed" / "*.png")]
    out = tmp_path / "predictions.csv"
    arguments = ["-r", str(demo_checkpoint), *inputs, "--top-k", "3"]
    # The one real `python predict.py` (this file is its end-to-end test).
    result = run_script("predict.py", *arguments, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    # Sorted by path, folder by folder: "10.jpg" before "2.png", as ImageFolder sorts.
    expected = [
        tmp_path / "globbed" / "1.png", tmp_path / "globbed" / "2.png",
        images / "a" / "deep" / "x.bmp", images / "a" / "z.png",
        images / "b" / "10.jpg", images / "b" / "2.png",
        tmp_path / "single.png",
    ]  # fmt: skip
    lines = result.stdout.splitlines()
    assert [line.split("  ")[0] for line in lines] == [str(path) for path in expected]
    rows = list(csv.DictReader(out.open()))
    assert [row["path"] for row in rows] == [str(path) for path in expected]
    for line, row in zip(lines, rows, strict=True):
        probabilities = [float(row[f"probability_{k}"]) for k in (1, 2, 3)]
        assert probabilities == sorted(probabilities, reverse=True) and sum(probabilities) <= 1
        assert {row[f"label_{k}"] for k in (1, 2, 3)} <= set(CLASSES)
        assert line.split("  ")[1] == f"{row['label_1']} {probabilities[0]:.4f}"
    # The same rows as JSON, from the same batches.
    json_out = tmp_path / "predictions.json"
    assert predict.main([*arguments, "--out", str(json_out)]) == 0
    written = json.loads(json_out.read_text())
    assert [item["path"] for item in written] == [row["path"] for row in rows]
    assert [item["labels"] for item in written] == [
        [row[f"label_{k}"] for k in (1, 2, 3)] for row in rows
    ]


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
@pytest.mark.skipif(not SAMPLE_DIR.is_dir(), reason=NO_SAMPLE)
def test_top1_on_real_images_is_the_argmax_test_py_computes(tmp_path):
    """Trained on the 2,000 sample images; predicted from the checkpoint alone (its data folder
    moved away), the 500 validation images get test.py's argmax, image by image."""
    loader_args = {"data_dir": str(SAMPLE_DIR), "preset": "cifar", "batch_size": 50}
    overrides = {
        "data_loader": {"type": "ImageFolderDataLoader", "args": loader_args},
        "trainer.epochs": 1,
        "trainer.tensorboard": False,
    }
    config = write_shrunk("configs/demo.json", tmp_path / "c.json", tmp_path / "saved", **overrides)
    result = run_main("train.py", "-c", str(config), "--run-id", "real")
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = tmp_path / "saved" / "models" / "Demo_CifarCNN" / "real" / "checkpoint-epoch1.pth"

    def move_data_away(state: dict) -> None:
        state["config"]["data_loader"]["args"]["data_dir"] = str(tmp_path / "nowhere")

    alone = edited_checkpoint(checkpoint, tmp_path / "alone.pth", move_data_away)
    out = tmp_path / "val.csv"
    arguments = ["-r", str(alone), str(SAMPLE_DIR / "val"), "--batch-size", "50"]
    result = run_main("predict.py", *arguments, "--out", str(out))
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 500

    paths, argmax = argmax_of_test_py(checkpoint)
    class_names = torch.load(checkpoint, weights_only=True)["class_names"]
    assert [row["path"] for row in rows] == paths
    assert [row["label_1"] for row in rows] == [class_names[index] for index in argmax]
    # And test.py itself, from its command line: its accuracy is predict.py's top-1 accuracy.
    result = run_main("test.py", "-r", str(checkpoint), "--json", str(tmp_path / "test.json"))
    assert result.returncode == 0, result.stderr
    accuracy = json.loads((tmp_path / "test.json").read_text())["metrics"]["test/accuracy"]
    hits = [row["label_1"] == Path(row["path"]).parent.name for row in rows]
    assert accuracy == pytest.approx(sum(hits) / len(hits), abs=1e-6)
    print(f"real sample: predict.py top-1 = test.py argmax on 500 images, accuracy {accuracy:.3f}")


def argmax_of_test_py(checkpoint: Path) -> tuple[list[str], list[int]]:
    """(paths, argmax of the logits) of test.py's test split, in its order, computed as
    test.py computes it: its trainer, its evaluate loop."""
    test_script = ENTRY_POINTS["test"]
    from build import build_trainer
    from parse_config import ConfigParser
    from utils.distributed.process_group import ProcessInfo
    from utils.state.checkpoint import load_checkpoint
    from utils.state.model_state import load_model_state

    config = ConfigParser.from_args(test_script.parse_args(["-r", str(checkpoint)]))
    logger = logging.getLogger("test")
    trainer = build_trainer(config, ProcessInfo(), torch.device("cpu"), logger, training=False)
    load_model_state(trainer.model, load_checkpoint(checkpoint), checkpoint)
    argmax: list[int] = []
    loader = trainer.data.eval_loader("test")
    trainer.evaluate(loader, "test", observe=lambda step: argmax.extend(step.output.argmax(1)))
    return [path for path, _ in trainer.data.dataset("test").samples], [int(i) for i in argmax]


def test_older_checkpoints_fall_back_to_class_indices(demo_checkpoint, tmp_path, capsys):
    older = edited_checkpoint(demo_checkpoint, tmp_path / "old.pth", lambda s: s.pop("class_names"))
    (image,) = write_images(tmp_path, ["x.png"])
    assert predict.main(["-r", str(older), str(image), "--top-k", "10"]) == 0
    out, err = capsys.readouterr()
    assert err == (
        f"warning: {older}: no class names (an older checkpoint) for 10 outputs; labels are "
        "class indices\n"
    )
    assert sorted(out.split()[1::2]) == sorted(str(index) for index in range(10))


def test_ema_predicts_with_the_averaged_weights(demo_checkpoint, tmp_path, capsys):
    def add_uniform_ema(state: dict) -> None:
        # Averaged weights whose head is zero: every class gets probability 1/10.
        averaged = {f"module.{key}": value.clone() for key, value in state["model"].items()}
        averaged["module.head.weight"].zero_()
        averaged["module.head.bias"].zero_()
        state["ema"] = {**averaged, "n_averaged": torch.tensor(5)}

    averaged = edited_checkpoint(demo_checkpoint, tmp_path / "ema.pth", add_uniform_ema)
    (image,) = write_images(tmp_path, ["x.png"])
    assert predict.main(["-r", str(averaged), str(image), "--top-k", "2", "--ema"]) == 0
    assert capsys.readouterr().out.split()[2::2] == ["0.1000", "0.1000"]
    assert predict.main(["-r", str(averaged), str(image), "--top-k", "2"]) == 0
    assert capsys.readouterr().out.split()[2] != "0.1000"


def test_an_unreadable_file_is_named_and_skipped(demo_checkpoint, tmp_path, capsys):
    images = tmp_path / "images"
    write_images(images, ["a.png", "c.png"])
    (images / "b.png").write_bytes(b"\x89PNG but cut short")
    out = tmp_path / "rows.json"
    assert predict.main(["-r", str(demo_checkpoint), str(images), "--out", str(out)]) == 1
    named, summary = capsys.readouterr().err.splitlines()
    assert named.startswith(f"error: {images / 'b.png'}: unreadable image (")
    assert (
        summary == "error: 1 of 3 files could not be read (named above); the others were predicted"
    )
    assert [row["path"] for row in json.loads(out.read_text())] == [
        str(images / "a.png"), str(images / "c.png")
    ]  # fmt: skip


class Touch:
    """Unpickling this calls Path.touch(marker): what a malicious checkpoint could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


CASES = {
    "missing path": (lambda t, c: [c, str(t / "nope.png")], "{t}/nope.png: no such file or folder"),
    "glob matching nothing": (lambda t, c: [c, str(t / "*.jpeg")], "{t}/*.jpeg: matches no file"),
    "folder without images": (lambda t, c: [c, str(t / "empty")], "{t}/empty: no image files"),
    "out exists": (
        lambda t, c: [c, str(t / "x.png"), "--out", str(t / "kept.csv")],
        "--out {t}/kept.csv: already exists; pass --force to replace it",
    ),
    "out of another kind": (
        lambda t, c: [c, str(t / "x.png"), "--out", str(t / "rows.txt")],
        "--out {t}/rows.txt: must end in .csv or .json",
    ),
    "foreign checkpoint": (
        lambda t, c: [str(t / "foreign.pth"), str(t / "x.png")],
        "{t}/foreign.pth: not a checkpoint written by this template",
    ),
    "unsafe checkpoint": (
        lambda t, c: [str(t / "unsafe.pth"), str(t / "x.png")],
        "{t}/unsafe.pth: refused to load: it references the Python object",
    ),
    "not a checkpoint": (
        lambda t, c: [str(t / "x.png"), str(t / "x.png")],
        "{t}/x.png: not a readable checkpoint",
    ),
    "run folder": (
        lambda t, c: [str(t / "empty"), str(t / "x.png")],
        "{t}/empty: a folder, not a checkpoint file; pass a checkpoint in it (e.g. "
        "{t}/empty/model_best.pth)",
    ),
    "cross-validation run folder": (  # its checkpoints lie in fold-<i>/
        lambda t, c: [str(t / "cv"), str(t / "x.png")],
        "{t}/cv: a folder, not a checkpoint file; pass a checkpoint in it (e.g. "
        "{t}/cv/fold-0/model_best.pth)",
    ),
    "no averaged weights": (
        lambda t, c: [c, str(t / "x.png"), "--ema"],
        "{c}: holds no averaged weights (trainer.ema_decay was off)",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_writes_nothing(case, demo_checkpoint, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "cv" / "fold-0").mkdir(parents=True)
    write_images(tmp_path, ["x.png"])
    (tmp_path / "kept.csv").write_text("keep me\n")
    torch.save({"weights": torch.zeros(1)}, tmp_path / "foreign.pth")
    unsafe = {"model": Touch(tmp_path / "ran"), "config": {}, "epoch": 1}
    torch.save(unsafe, tmp_path / "unsafe.pth")
    arguments, expected = CASES[case]
    checkpoint, *rest = arguments(tmp_path, str(demo_checkpoint))
    before = sorted(tmp_path.rglob("*"))
    assert predict.main(["-r", checkpoint, *rest]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: " + expected.format(t=tmp_path, c=demo_checkpoint)), err
    assert err.count("\n") == 1 and out == ""
    assert sorted(tmp_path.rglob("*")) == before
    assert (tmp_path / "kept.csv").read_text() == "keep me\n"
    assert not (tmp_path / "ran").exists()


def test_force_replaces_the_out_file(demo_checkpoint, tmp_path):
    (image,) = write_images(tmp_path, ["x.png"])
    out = tmp_path / "rows.csv"
    out.write_text("old\n")
    arguments = ["-r", str(demo_checkpoint), str(image), "--out", str(out), "--force"]
    assert predict.main(arguments) == 0
    assert out.read_text().startswith("path,label_1,probability_1,")


def test_data_without_a_transform_preset_is_refused(tmp_path, capsys):
    """configs/denoise.json: its inputs are not made by a preset that the config names."""
    from model.model import DenoisingCNN

    config = json.loads((ROOT / "configs/denoise.json").read_text())
    model = DenoisingCNN(**config["arch"]["args"])
    torch.save({"model": model.state_dict(), "config": config, "epoch": 1}, tmp_path / "d.pth")
    (image,) = write_images(tmp_path, ["x.png"])
    assert predict.main(["-r", str(tmp_path / "d.pth"), str(image)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: {tmp_path}/d.pth (its config): data_loader: NoisyShapesDataLoader"
    )
    assert "preset" in err and err.count("\n") == 1


def test_a_run_with_test_time_augmentation_predicts_what_test_py_scores(demo_checkpoint, tmp_path):
    """trainer.tta_flip: test.py scores the model averaged over each image and its mirror image
    (base/evaluation.py's averaged_over_views); predict.py gave the plain model's classes."""

    def flipped_views(state: dict) -> None:
        state["config"]["trainer"]["tta_flip"] = True

    checkpoint = edited_checkpoint(demo_checkpoint, tmp_path / "tta.pth", flipped_views)
    paths = write_images(tmp_path / "images", [f"{index}.png" for index in range(6)])
    out = tmp_path / "predicted.json"
    arguments = ["-r", str(checkpoint), str(tmp_path / "images"), "--top-k", "10"]
    result = run_main("predict.py", *arguments, "--out", str(out))
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())
    model, config, _ = load_inference_model(checkpoint)
    trainer = SimpleNamespace(options=config["trainer"], model=model)
    images = torch.stack([input_transform(config)(load_image(str(path))) for path in paths])
    with torch.no_grad(), averaged_over_views(trainer, model):
        probabilities = trainer.model(images).softmax(dim=1)  # (6, 10), test.py's
    assert [row["path"] for row in rows] == [str(path) for path in paths]
    for row, expected in zip(rows, probabilities, strict=True):
        top = expected.topk(10)
        assert row["labels"] == [CLASSES[index] for index in top.indices.tolist()]
        assert row["probabilities"] == pytest.approx(top.values.tolist(), abs=1e-6)


def test_predict_py_on_a_jsonl_test_file_gets_test_py_s_accuracy(tmp_path):
    """Sequences: predict.py reads the test file itself (its labels ignored), pads it as one
    file and runs batches of 5 where test.py pads and runs batches of 32: the same classes."""
    write_sequences(tmp_path / "data", sizes={"train": 64, "val": 16, "test": 24})
    overrides = {"data_loader.args.data_dir": str(tmp_path / "data"), "trainer.epochs": 1}
    config = write_shrunk(
        "configs/sequences.json", tmp_path / "c.json", tmp_path / "saved", **overrides
    )
    assert run_main("train.py", "-c", str(config), "--run-id", "r").returncode == 0
    checkpoint = tmp_path / "saved" / "models" / "Sequences_GRU" / "r" / "checkpoint-epoch1.pth"
    report = tmp_path / "report.json"
    result = run_main("test.py", "-r", str(checkpoint), "--json", str(report))
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy = json.loads(report.read_text())["metrics"]["test/accuracy"]
    test_file, out = tmp_path / "data" / "test.jsonl", tmp_path / "predicted.json"
    arguments = [str(test_file), "--batch-size", "5", "--top-k", "1", "--out", str(out)]
    result = run_main("predict.py", "-r", str(checkpoint), *arguments)
    assert result.returncode == 0, result.stderr[-3000:]
    labels = [json.loads(line)["label"] for line in test_file.read_text().splitlines()]
    predicted = [row["labels"][0] for row in json.loads(out.read_text())]
    hits = [label == guess for label, guess in zip(labels, predicted, strict=True)]
    assert accuracy == pytest.approx(sum(hits) / len(hits), abs=1e-9)

"""The detection worked example (docs/extending.md#worked-example-detection): images and a CSV of
boxes on disk (data_loader/tasks/detection.py), targets as lists of dicts through the engine, a
detector from scratch (model/detector.py) whose step returns no training output
(trainer/detection.py), and mAP (torchmetrics' MeanAveragePrecision, an optional extra) over
every detection of the epoch, on one process or two.

Figures (-m slow -s, this CPU, one thread): the shipped config trains to test mAP@0.5 0.658
against an untrained detector's 0.000 (189 s under load, about a minute idle); two ranks validate
to the mAP one process computes on all the detections at once (0.6067937016487122 both); a stop
inside an epoch resumes bit-exact."""

import csv
import importlib.util
import io
import json
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    NUM_EXAMPLES,
    assert_stopped_run_resumes_bit_exact,
    run_main,
    torchrun,
    write_shrunk,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from test_model import assert_refuses_numbers_of_classes_that_are_no_count

from data_loader.tasks.detection import DetectionDataLoader, write_detection
from model.detector import TinyDetector
from model.loss import sum_of_losses
from model.metric import accuracy
from model.torchvision_model import check_classifier
from utils.evaluation.metric_sums import MetricSums, StepOutput
from utils.util import ConfigValueError, DataError

HAS_MAP = all(importlib.util.find_spec(name) for name in ("torchmetrics", "pycocotools"))
needs_map = pytest.mark.skipif(
    not HAS_MAP, reason="the detection extra is not installed (pip install -e '.[detection]')"
)
RUNS = Path("saved") / "models" / "Detection_Shapes"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("detection") / "data"
    write_detection(folder, num_train=48, num_test=16, seed=0)
    return folder


def tiny_config(tmp_path: Path, data: Path, **overrides: object) -> Path:
    """configs/detection.json shrunk: a 4-channel detector on the 48 images, batches of 8."""
    settings_ = {
        "data_loader.args.data_dir": str(data),
        "data_loader.args.batch_size": 8,
        "arch.args.width": 4,
        "trainer.tensorboard": False,
        "trainer.deterministic": True,
        **overrides,
    }
    return write_shrunk(
        "configs/detection.json", tmp_path / "d.json", tmp_path / "saved", **settings_
    )


def loader(data: Path, **args: object) -> DetectionDataLoader:
    return DetectionDataLoader(data_dir=str(data), **{"batch_size": 4, "seed": 0, **args})


# --- the data: files on disk to batches of (images, list of target dicts) ----------------------


def test_the_files_load_as_images_and_one_dict_of_boxes_per_image(data_dir):
    data = loader(data_dir)
    assert data.class_names() == ["disk", "square", "triangle"]
    images, targets = next(iter(data.train_loader()))
    assert images.shape == (4, 3, 64, 64) and images.dtype == torch.float32
    assert isinstance(targets, list) and len(targets) == 4
    for target in targets:
        boxes, labels = target["boxes"], target["labels"]
        assert boxes.dtype == torch.float32 and boxes.shape == (len(labels), 4)
        assert labels.dtype == torch.int64 and 1 <= len(labels) <= 4
        assert (boxes[:, :2] < boxes[:, 2:]).all() and boxes.min() >= 0 and boxes.max() <= 64
        assert data.target_classes(target).tolist() == labels.tolist()
    # Every row of the CSV is one box of one image.
    with open(data_dir / "train" / "boxes.csv") as file:
        num_rows = sum(1 for _ in csv.DictReader(file))
    assert sum(len(target["labels"]) for target in data.dataset("train").targets) == num_rows


def test_an_image_without_boxes_has_int64_labels_too(tmp_path):
    """An image without rows: boxes (0, 4) and labels int64 (0,), the dtype of every other
    image's (torch.tensor([]) is float32, which torch.cat of a batch's labels then spreads)."""
    write_detection(tmp_path, num_train=4, num_test=3)
    with open(tmp_path / "test" / "boxes.csv", newline="") as file:
        rows = [row for row in csv.reader(file) if row[0] != "00001.png"]
    with open(tmp_path / "test" / "boxes.csv", "w", newline="") as file:
        csv.writer(file).writerows(rows)
    _, targets = next(iter(loader(tmp_path).eval_loader("test")))
    assert [len(target["labels"]) for target in targets][1] == 0
    assert all(target["labels"].dtype == torch.int64 for target in targets)
    assert targets[1]["boxes"].shape == (0, 4)
    assert torch.cat([target["labels"] for target in targets]).dtype == torch.int64


def test_a_step_that_edits_its_targets_in_place_leaves_the_data_as_it_was(tmp_path):
    """Without worker processes (and on the CPU, where to_device copies nothing) a batch's
    target dicts were the dataset's own: a step scaling its boxes in place scaled them for
    every later epoch."""
    write_detection(tmp_path, num_train=4, num_test=2)
    data = loader(tmp_path)
    before = [target["boxes"].clone() for _, target in data.dataset("train")]
    for _ in range(2):  # two epochs of a step that edits its targets
        for _, targets in data.train_loader():
            for target in targets:
                target["boxes"].mul_(0.5)  # e.g. a resize of its boxes
                target["labels"].zero_()
    after = [target for _, target in data.dataset("train")]
    assert all(torch.equal(old, new["boxes"]) for old, new in zip(before, after, strict=True))
    assert any(target["labels"].any() for target in after)  # not all class 0


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (["00000.png", "disk", "9", "1", "3", "5"], "line 2: the box needs x1 < x2 and y1 < y2"),
        (["00000.png", "disk", "a", "1", "3", "5"], "line 2: corners that are not numbers"),
        (["00000.png", "star", "1", "1", "3", "5"], "line 2: class 'star' is not one of"),
        (["99999.png", "disk", "1", "1", "3", "5"], "boxes of missing image 99999.png"),
        # Outside the 64 x 64 image, or fractions of it (YOLO's normalised corners).
        (["00000.png", "disk", "60", "1", "70", "5"], r"line 2: the box 60,1,70,5 is not inside"),
        (
            ["00000.png", "disk", "-2", "1", "3", "5"],
            "line 2: the box -2,1,3,5 is not inside the 64",
        ),
        (
            ["00000.png", "disk", "0.1", "0.2", "0.5", "0.6"],
            r"every corner is within \[0, 1\] on 64 x 64 images: give them in pixels",
        ),
    ],
)
def test_a_bad_row_of_boxes_is_refused_in_one_line(tmp_path, row, message):
    write_detection(tmp_path, num_train=2, num_test=2)
    with open(tmp_path / "test" / "boxes.csv", "w", newline="") as file:
        csv.writer(file).writerows([["file", "label", "x1", "y1", "x2", "y2"], row])
    with pytest.raises(DataError, match=message) as error:
        loader(tmp_path).dataset("test")
    assert "\n" not in str(error.value)


def test_images_of_several_sizes_in_a_split_are_refused_in_one_line(tmp_path):
    """Batches stack the images: one of another size was torch.stack's RuntimeError traceback
    from inside the DataLoader, at the first batch that held it (maybe hours into training)."""
    write_detection(tmp_path, num_train=6, num_test=2)
    path = tmp_path / "train" / "images" / "00003.png"
    with Image.open(path) as image:
        image.resize((48, 40)).save(path)
    with pytest.raises(DataError) as error:
        loader(tmp_path).train_loader()
    assert str(error.value) == (
        f"{tmp_path / 'train' / 'images'}: images of several sizes (00000.png is 64 x 64, "
        "00003.png 48 x 40); a batch stacks them: give every image of a split one size"
    )
    loader(tmp_path).dataset("test")  # the other split is of one size


def read_rows(path: Path) -> list[list[str]]:
    """The rows of a boxes.csv, its header first."""
    return list(csv.reader(path.open(newline="")))


def write_rows(path: Path, rows: list[list[str]]) -> None:
    with path.open("w", newline="") as file:
        csv.writer(file).writerows(rows)


def test_the_fingerprint_changes_with_any_box_and_only_then(data_dir, tmp_path):
    """An edited boxes.csv (a corner moved, a label changed, a box added or removed) changes the
    fingerprint of the split that holds the image, and only of it; re-sorting the rows of
    different images does not. It was the file names alone: a resume went on, without a word,
    on boxes other than the checkpoint's."""
    shutil.copytree(data_dir, tmp_path / "data")
    path = tmp_path / "data" / "train" / "boxes.csv"
    header, *rows = read_rows(path)
    data = loader(tmp_path / "data", validation_split=0.25)
    before = data.fingerprint()
    validation_images = {data.dataset("train").paths[i].name for i in data.split_indices()[1]}

    @settings(max_examples=30, deadline=None)
    @given(st.integers(0, len(rows) - 1), st.sampled_from(["corner", "label", "drop", "add"]))
    def check(index, edit):
        edited = [list(row) for row in rows]
        row = edited[index]
        if edit == "corner":  # x2 one pixel in (every box here is wider than one pixel)
            row[4] = str(int(row[4]) - 1)
        elif edit == "label":
            row[1] = {"disk": "square", "square": "triangle", "triangle": "disk"}[row[1]]
        elif edit == "drop":
            del edited[index]
        else:
            edited.insert(index, list(row))
        write_rows(path, [header, *edited])
        after = loader(tmp_path / "data", validation_split=0.25).fingerprint()
        changed = "val" if row[0] in validation_images else "train"
        kept = {"train": "val", "val": "train"}[changed]
        assert after[changed] != before[changed] and after[kept] == before[kept]

    check()
    # The rows of different images in another order: the same boxes.
    write_rows(path, [header, *sorted(rows, key=lambda row: row[0], reverse=True)])
    assert loader(tmp_path / "data", validation_split=0.25).fingerprint() == before


def test_upper_case_pngs_are_data_and_hidden_files_are_not(tmp_path):
    """A camera's 00009.PNG was skipped (its boxes then "of missing image"), and macOS's
    ._00001.png beside each copied file was read as an image: PIL's UnidentifiedImageError
    traceback, in training and in predict.py's folder search."""
    write_detection(tmp_path, num_train=6, num_test=2)
    images = tmp_path / "train" / "images"
    (images / "._00001.png").write_bytes(b"\x00\x05\x16\x07AppleDouble")
    shutil.copy(images / "00002.png", images / "00009.PNG")
    with (tmp_path / "train" / "boxes.csv").open("a") as file:
        file.write("00009.PNG,disk,1,2,30,40\n")
    dataset = loader(tmp_path).dataset("train")
    assert [path.name for path in dataset.paths][-2:] == ["00005.png", "00009.PNG"]
    assert dataset.targets[-1]["boxes"].tolist() == [[1, 2, 30, 40]]
    names, inputs = DetectionDataLoader.read_inputs(images, {}, None)
    assert [Path(name).name for name in names] == [path.name for path in dataset.paths]
    assert len(inputs) == 7


def test_a_boxes_csv_saved_by_excel_reads_as_the_same_boxes(tmp_path):
    """Excel's "CSV UTF-8" (a byte order mark, CRLF line ends): the first column was read as
    "\\ufefffile", and the file refused as without the columns it visibly has."""
    write_detection(tmp_path, num_train=6, num_test=2)
    before = loader(tmp_path).fingerprint()
    path = tmp_path / "train" / "boxes.csv"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n"))
    data = loader(tmp_path)
    assert data.class_names() == ["disk", "square", "triangle"] and data.fingerprint() == before


def test_missing_files_are_refused_in_one_line(tmp_path):
    write_detection(tmp_path, num_train=2, num_test=2)
    (tmp_path / "test" / "boxes.csv").unlink()
    with pytest.raises(DataError, match=r"test/boxes.csv: missing \(write_detection writes"):
        loader(tmp_path).dataset("test")
    with pytest.raises(DataError, match=r"nowhere/train/boxes.csv: missing"):
        loader(tmp_path / "nowhere").class_names()
    with pytest.raises(DataError, match=r"no.png: no image there"):
        DetectionDataLoader.read_inputs(tmp_path / "no.png", {}, None)


def test_prediction_rows_are_one_per_box_and_one_for_an_image_without(tmp_path):
    outputs = [
        {"boxes": torch.tensor([[1.0, 2.0, 30.5, 40.25], [3.0, 4.0, 5.0, 6.0]]),
         "scores": torch.tensor([0.9, 0.25]), "labels": torch.tensor([2, 0])},
        {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.int64)},
    ]  # fmt: skip
    rows = DetectionDataLoader.prediction_rows(
        ["a.png", "b.png"], outputs, class_names=["disk", "square", "triangle"], out_dir=None
    )
    assert rows == [
        {"path": "a.png", "label": "triangle", "score": 0.9, "x1": 1.0, "y1": 2.0, "x2": 30.5,
         "y2": 40.25},
        {"path": "a.png", "label": "disk", "score": 0.25, "x1": 3.0, "y1": 4.0, "x2": 5.0, "y2": 6.0},
        {"path": "b.png"},
    ]  # fmt: skip


def test_a_class_the_checkpoint_does_not_name_is_its_index_not_an_index_error():
    """A model with more outputs than the data has classes (num_classes 3 kept from the shipped
    config, data of 2 classes: the label check allows it) can detect class 2: predict.py's
    rows name it by its index, as predict.py does for a classifier, instead of an IndexError."""
    outputs = [
        {"boxes": torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]),
         "scores": torch.tensor([0.5, 0.25]), "labels": torch.tensor([2, 1])},
    ]  # fmt: skip
    rows = DetectionDataLoader.prediction_rows(
        ["a.png"], outputs, class_names=["disk", "square"], out_dir=None
    )
    assert [row["label"] for row in rows] == ["2", "square"]


def test_read_inputs_reads_a_folder_as_the_model_sees_it(data_dir):
    names, images = DetectionDataLoader.read_inputs(data_dir / "test" / "images", {}, None)
    assert len(names) == 16 and names[0].endswith("00000.png")
    expected, _ = loader(data_dir).view("test", False)[0]
    assert torch.equal(images[0], expected)


# --- the model and its step ----------------------------------------------------------------------


def test_the_detector_returns_losses_with_targets_and_detections_without():
    torch.manual_seed(0)
    model = TinyDetector(num_classes=3, width=4, max_detections=5)
    images = torch.rand(2, 3, 64, 64)
    targets = [
        {"boxes": torch.tensor([[4.0, 4.0, 20.0, 24.0]]), "labels": torch.tensor([1])},
        {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64)},  # no boxes
    ]
    losses = model(images, targets)
    assert set(losses) == {"classification", "box"}
    assert all(value.dim() == 0 and torch.isfinite(value) for value in losses.values())
    sum_of_losses(losses, targets).backward()
    assert all(param.grad is not None for param in model.parameters())
    model.eval()
    detections = model(images)
    assert len(detections) == 2
    for found in detections:
        assert found["boxes"].shape == (len(found["scores"]), 4) and len(found["scores"]) <= 5
        assert found["labels"].dtype == torch.int64 and (found["labels"] < 3).all()
        assert (found["scores"] > model.score_threshold).all()


@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [
        ("num_classes", "3", "an integer >= 1"),
        ("width", 0, "an integer >= 1"),
        ("max_detections", 0, "an integer >= 1"),
        ("max_detections", -1, "an integer >= 1"),
        ("centre_radius", 0, "a number > 0"),
        ("score_threshold", 5, "a number in [0, 1)"),
        ("score_threshold", 1.0, "a number in [0, 1)"),
        ("nms_threshold", 50, "a number in [0, 1]"),
        ("nms_threshold", -0.5, "a number in [0, 1]"),
    ],
)
def test_a_detector_argument_out_of_range_is_refused(name, value, rule):
    """Each of these trained and validated without a word: score_threshold 5 (a percent) or
    max_detections 0 left no detections (mAP 0), nms_threshold 50 suppressed nothing,
    centre_radius 0 gave no cell a box to learn, max_detections -1 dropped the last box."""
    with pytest.raises(ConfigValueError) as error:
        TinyDetector(**{name: value})
    assert str(error.value) == f"{name} must be {rule}, got {value!r}"


def test_sum_of_losses_refuses_an_output_that_is_not_a_dict():
    with pytest.raises(ValueError, match="sum_of_losses: the output is a Tensor, not a dict"):
        sum_of_losses(torch.zeros(2, 3), None)


def test_steps_without_output_give_the_loss_alone_and_mixed_ones_score_the_rest():
    targets = torch.tensor([0, 1, 1])
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    sums = MetricSums({"accuracy": accuracy}, torch.device("cpu"))
    for loss in (1.0, 3.0):
        sums.add(StepOutput(loss=torch.tensor(loss), output=None, target=targets))
    assert sums.result("train") == {"train/loss": 2.0, "train/num_samples": 6.0}
    sums.add(StepOutput(loss=torch.tensor(2.0), output=logits, target=targets))
    result = sums.result("train")
    # Accuracy 2/3 on the scored batch, a sum of 2 over the 9 samples (the engine's convention:
    # a sample-weighted mean; a task mixes steps with and without output only by choice).
    assert result["train/accuracy"] == pytest.approx(2 / 9)


# --- mAP: over every detection of the epoch, however cut ------------------------------------------


def random_detections(seed: int, num_images: int) -> tuple[list[dict], list[dict]]:
    """Predictions and targets of `num_images` images: boxes near the targets' and strays."""
    generator = torch.Generator().manual_seed(seed)
    predictions, targets = [], []
    for _ in range(num_images):
        num_boxes = int(torch.randint(0, 4, (), generator=generator))
        corner = torch.rand(num_boxes, 2, generator=generator) * 40
        boxes = torch.cat(
            [corner, corner + 5 + torch.rand(num_boxes, 2, generator=generator) * 20], 1
        )
        labels = torch.randint(0, 3, (num_boxes,), generator=generator)
        targets.append({"boxes": boxes, "labels": labels})
        noisy = boxes + torch.randn(boxes.shape, generator=generator) * 3
        stray = torch.rand(2, 4, generator=generator).sort(dim=1).values * 60
        predictions.append(
            {"boxes": torch.cat([noisy, stray]), "labels": torch.cat([labels, torch.tensor([0, 2])]),
             "scores": torch.rand(num_boxes + 2, generator=generator)}
        )  # fmt: skip
    return predictions, targets


@needs_map
@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_map_is_torchmetrics_on_all_detections_at_once_for_any_batch_cut(num_examples):
    from torchmetrics.detection import MeanAveragePrecision as Reference

    from model.metric import MeanAveragePrecision

    @settings(max_examples=num_examples)
    @given(st.integers(0, 2**16), st.integers(1, 12), st.lists(st.integers(1, 5), max_size=12))
    def check(seed: int, num_images: int, cuts: list[int]) -> None:
        predictions, targets = random_detections(seed, num_images)
        reference = Reference(iou_thresholds=[0.5])
        reference.update(predictions, targets)
        metric = MeanAveragePrecision(iou_threshold=0.5)
        sums = MetricSums({"map": metric}, torch.device("cpu"))
        start = 0
        for size in [*cuts, num_images]:
            batch = slice(start, min(start + size, num_images))
            if batch.start < batch.stop:
                sums.add(StepOutput(torch.tensor(0.0), predictions[batch], targets[batch]))
            start = batch.stop
        assert sums.result("val")["val/map"] == float(reference.compute()["map"])

    check()


@needs_map
def test_an_unknown_map_backend_is_refused_in_one_line():
    from model.metric import MeanAveragePrecision
    from utils import ConfigValueError

    with pytest.raises(ConfigValueError, match=r"^MeanAveragePrecision: .*backend.*extra") as error:
        MeanAveragePrecision(backend="nope")
    assert "\n" not in str(error.value)


@needs_map
@pytest.mark.parametrize("iou_threshold", [50, 1.5, 0, -0.5, True, "0.5"])
def test_an_iou_threshold_outside_0_to_1_is_refused_before_training(
    data_dir, tmp_path, iou_threshold
):
    """torchmetrics takes any number and pycocotools clips it: iou_threshold 50 (meant as
    mAP@50) counted only boxes of IoU 1, a silent mAP of about 0; -0.5 counted every box."""
    metrics = [{"type": "MeanAveragePrecision", "args": {"iou_threshold": iou_threshold}}]
    config = tiny_config(tmp_path, data_dir, metrics=metrics)
    result = run_main("train.py", "-c", str(config))
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"error: {config}: metrics[0].args: MeanAveragePrecision: iou_threshold must be a number "
        f"in (0, 1] (0.5: mAP@0.5), or null for COCO's 0.5 to 0.95, got {iou_threshold!r}"
    )
    assert not (tmp_path / "saved").exists()


# --- end to end: train.py, test.py, export.py on the files ----------------------------------------


@pytest.fixture(scope="module")
def tiny_run(data_dir, tmp_path_factory) -> tuple[Path, str]:
    """Two epochs of the tiny detector: (its run folder, train.py's output)."""
    tmp_path = tmp_path_factory.mktemp("tiny_run")
    config = tiny_config(tmp_path, data_dir)
    result = run_main("train.py", "-c", str(config), "--run-id", "tiny")
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path / RUNS / "tiny", result.stdout + result.stderr


@needs_map
def test_train_py_trains_validates_with_map_and_counts_boxes_per_class(tiny_run):
    run_dir, output = tiny_run
    # The data summary counts the boxes of each class, beside the images.
    assert "Training data: 43 samples; per class (occurrences in the targets): disk " in output
    metrics = torch.load(run_dir / "checkpoint-epoch2.pth", weights_only=True)["metrics"]
    assert 0.0 <= metrics["val/MeanAveragePrecision"] <= 1.0
    # Training makes no detections: its loss alone, no training mAP.
    assert "train/loss" in metrics and "train/MeanAveragePrecision" not in metrics


@needs_map
def test_test_py_reports_the_map_of_the_test_images(tiny_run, tmp_path):
    report = tmp_path / "report.json"
    result = run_main(
        "test.py", "-r", str(tiny_run[0] / "checkpoint-epoch2.pth"), "--json", str(report)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(report.read_text())
    assert results["num_samples"] == 16 and set(results["metrics"]) == {
        "test/loss", "test/MeanAveragePrecision"
    }  # fmt: skip


@needs_map
def test_export_refuses_a_detector_in_one_line(tiny_run, tmp_path):
    checkpoint = tiny_run[0] / "checkpoint-epoch2.pth"
    result = run_main("export.py", "-r", str(checkpoint), "--out", str(tmp_path / "d.pt2"))
    assert result.returncode != 0
    assert result.stderr == (
        f"error: {checkpoint}: the model returns a list; export needs a tensor\n"
    )
    assert not (tmp_path / "d.pt2").exists()


# --- the figures: it learns; two ranks are one; a resume is exact (slow) ------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, float]:
    """configs/detection.json as shipped (20 epochs of 400 images), but 41 validation images:
    (its run folder, the data, the seconds train.py took)."""
    tmp_path = tmp_path_factory.mktemp("trained")
    write_detection(tmp_path / "data", num_train=400, num_test=100, seed=0)
    config = write_shrunk(
        "configs/detection.json", tmp_path / "d.json", tmp_path / "saved",
        **{"data_loader.args.data_dir": str(tmp_path / "data"), "data_loader.args.batch_size": 16,
           "data_loader.args.validation_split": 41, "trainer.epochs": 20,
           "trainer.tensorboard": False, "trainer.log_step": 10},
    )  # fmt: skip
    start = time.perf_counter()
    result = run_main("train.py", "-c", str(config), "--run-id", "trained")
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path / RUNS / "trained", tmp_path / "data", time.perf_counter() - start


@needs_map
@pytest.mark.slow  # about a minute of training on one core
def test_the_detector_learns_far_above_an_untrained_one(trained, tmp_path):
    from model.metric import MeanAveragePrecision

    run_dir, data, seconds = trained
    report = tmp_path / "report.json"
    result = run_main("test.py", "-r", str(run_dir / "model_best.pth"), "--json", str(report))
    assert result.returncode == 0, result.stderr[-3000:]
    trained_map = json.loads(report.read_text())["metrics"]["test/MeanAveragePrecision"]
    # The baseline: the same detector at its random initialisation, on the same test images,
    # its 50 best boxes per image whatever their score (at the prior's 1% object probability
    # the default score_threshold would leave it none, an mAP of 0 by construction).
    torch.manual_seed(0)
    untrained = TinyDetector(num_classes=3, width=16, score_threshold=0.0).eval()
    metric = MeanAveragePrecision(iou_threshold=0.5)
    num_boxes = 0
    with torch.no_grad():
        for images, targets in loader(data, batch_size=25).eval_loader("test"):
            detections = untrained(images)
            num_boxes += sum(len(found["boxes"]) for found in detections)
            metric.update(detections, targets)
    assert num_boxes == 50 * 100
    untrained_map = float(metric.compute())
    print(f"test mAP@0.5: trained {trained_map:.3f}, untrained {untrained_map:.4f}; "
          f"train.py {seconds:.0f} s")  # fmt: skip
    assert untrained_map < 0.05 and trained_map > 0.45


@needs_map
@pytest.mark.slow  # two processes of torchrun
def test_two_ranks_validate_to_the_map_of_all_detections_at_once(trained, tmp_path):
    run_dir, _, _ = trained
    # One more epoch under torchrun, 41 validation images on 2 ranks (21 and 20).
    torchrun("-r", str(run_dir / "checkpoint-epoch20.pth"), "--epochs", "21")
    checkpoint = run_dir / "checkpoint-epoch21.pth"
    two_ranks = torch.load(checkpoint, weights_only=True)["metrics"]["val/MeanAveragePrecision"]
    # test.py: the same weights and images in one process, every detection in one metric.
    report = tmp_path / "report.json"
    result = run_main("test.py", "-r", str(checkpoint), "--split", "val", "--json", str(report))
    assert result.returncode == 0, result.stderr[-3000:]
    one_process = json.loads(report.read_text())["metrics"]["val/MeanAveragePrecision"]
    print(f"val mAP@0.5: 2 ranks {two_ranks!r}, 1 process {one_process!r}")
    assert two_ranks > 0.3 and two_ranks == pytest.approx(one_process, abs=1e-9)


@pytest.fixture
def stop_at_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    """trainer.type "DetectionStopAt": DetectionTrainer that asks to stop (as SIGTERM would)
    once optimizer step trainer.args.stop_at_step has been taken."""
    import trainer as trainer_module

    class DetectionStopAt(trainer_module.DetectionTrainer):
        def __init__(self, *args, stop_at_step: int = 0, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.stop_at_step = stop_at_step

        def training_step(self, batch):
            if self.global_step + 1 == self.stop_at_step:
                self.stop.signum = signal.SIGTERM
            return super().training_step(batch)

    monkeypatch.setattr(trainer_module, "DetectionStopAt", DetectionStopAt, raising=False)
    monkeypatch.setattr(trainer_module, "__all__", [*trainer_module.__all__, "DetectionStopAt"])


@needs_map
def test_a_stop_inside_an_epoch_resumes_bit_exact(data_dir, tmp_path, stop_at_detection):
    config = tiny_config(tmp_path, data_dir, **{"trainer.type": "DetectionStopAt"})
    # 6 batches an epoch: stopped 2 into epoch 2.
    assert_stopped_run_resumes_bit_exact(config, tmp_path / RUNS, stop_at_step=8)


@needs_map
def test_a_resume_on_edited_boxes_is_refused_unless_allowed(data_dir, tmp_path):
    """Every box of the training images one pixel narrower after epoch 1: the resume, and
    test.py --split val, refuse it in one line (they went on, the file names being the same);
    --allow-data-change goes on, saying so."""
    shutil.copytree(data_dir, tmp_path / "data")
    config = tiny_config(tmp_path, tmp_path / "data", **{"trainer.epochs": 1})
    assert run_main("train.py", "-c", str(config), "--run-id", "r").returncode == 0
    path = tmp_path / "data" / "train" / "boxes.csv"
    header, *rows = read_rows(path)
    write_rows(path, [header, *([*row[:4], str(int(row[4]) - 1), row[5]] for row in rows)])
    run_dir = tmp_path / RUNS / "r"
    change = "training split: other samples (43); validation split: other samples (5)"
    result = run_main("train.py", "-r", str(run_dir), "--epochs", "2")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"the data changed since this checkpoint ({change}); resume on" in result.stderr
    validated = run_main("test.py", "-r", str(run_dir / "checkpoint-epoch1.pth"), "--split", "val")
    assert validated.returncode == 2 and "validation split: other samples (5)" in validated.stderr
    resumed = run_main("train.py", "-r", str(run_dir), "--epochs", "2", "--allow-data-change")
    assert resumed.returncode == 0 and "The data changed since" in resumed.stdout + resumed.stderr


@needs_map
def test_predict_py_takes_a_folder_of_several_image_sizes(data_dir, tmp_path):
    """The detector is fully convolutional: a folder of 64 x 64, 48 x 40 and 72 x 56 images
    gives each image the rows it gets alone (it was refused: "images of several sizes; predict
    one size at a time"). Its 5 best boxes per image, whatever their scores."""
    overrides = {"trainer.epochs": 1, "arch.args.score_threshold": 0, "arch.args.max_detections": 5}
    config = tiny_config(tmp_path, data_dir, **overrides)
    assert run_main("train.py", "-c", str(config), "--run-id", "r").returncode == 0
    folder = tmp_path / "photos"
    folder.mkdir()
    for index, size in enumerate([None, None, (48, 40), (48, 40), (72, 56), None]):
        with Image.open(data_dir / "test" / "images" / f"{index:05d}.png") as image:
            (image.resize(size) if size else image).save(folder / f"{index}.png")
    checkpoint = str(tmp_path / RUNS / "r" / "checkpoint-epoch1.pth")

    def predicted(*inputs: Path) -> list[dict]:
        out = tmp_path / "rows.json"
        result = run_main(
            "predict.py", "-r", checkpoint, *map(str, inputs), "--out", str(out), "--force"
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return json.loads(out.read_text())

    together = predicted(folder)
    alone = [row for path in sorted(folder.iterdir()) for row in predicted(path)]
    assert [row["path"] for row in together] == [row["path"] for row in alone]
    assert len(together) == 6 * 5 and all("score" in row for row in together)
    for row, expected in zip(together, alone, strict=True):
        assert row == pytest.approx(expected, abs=0.011)  # rounded to 2 decimals


@needs_map
def test_predict_py_writes_the_boxes_of_each_image_as_json_and_csv(tiny_run, data_dir, tmp_path):
    """predict.py through the loader's read_inputs and prediction_rows: a row per box (or the
    path alone), the same rows in JSON and CSV, every test image accounted for."""
    checkpoint = str(tiny_run[0] / "checkpoint-epoch2.pth")
    images = data_dir / "test" / "images"
    rows = {}
    for suffix in (".json", ".csv"):
        out = tmp_path / f"boxes{suffix}"
        result = run_main("predict.py", "-r", checkpoint, str(images), "--out", str(out))
        assert result.returncode == 0, result.stderr[-2000:]
        rows[suffix] = out.read_text()
    found = json.loads(rows[".json"])
    assert {Path(row["path"]).name for row in found} == {p.name for p in images.glob("*.png")}
    table = list(csv.DictReader(io.StringIO(rows[".csv"])))
    assert [row["path"] for row in table] == [row["path"] for row in found]
    for row, parsed in zip(found, table, strict=True):
        if "label" in row:  # a detected box: a class name and corners inside the image
            assert row["label"] in ("disk", "square", "triangle")
            assert float(parsed["score"]) == row["score"] and row["x1"] < row["x2"]


@needs_map
def test_test_time_augmentation_of_a_detector_is_refused_in_one_line(data_dir, tmp_path):
    """A view would move the boxes the step hands the model: refused before anything is
    written (it was a TypeError traceback from AverageOverViews.forward)."""
    config = tiny_config(tmp_path, data_dir, **{"trainer.tta_flip": True})
    result = run_main("train.py", "-c", str(config))
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "error: trainer.tta_flip / tta_translate: average model(images) over views, but the step "
        "calls the model with 2 arguments; turn test-time augmentation off"
    )
    assert not (tmp_path / "saved").exists()


@pytest.mark.parametrize("mixing", [{"mixup_alpha": 0.2}, {"cutmix_alpha": 1.0}])
def test_batch_mixing_of_a_detector_is_refused_in_one_line(data_dir, tmp_path, mixing):
    """DetectionTrainer's step never called the mixing Trainer builds: MixUp or CutMix in the
    config trained without them, without a word (they would have to mix the boxes too)."""
    # Without the mAP metric, so that it runs where the detection extra is not installed too.
    unmeasured = {"metrics": [], "trainer.monitor": "min val/loss"}
    config = tiny_config(tmp_path, data_dir, batch_mixing=mixing, **unmeasured)
    result = run_main("train.py", "-c", str(config))
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"error: {config}: batch_mixing: DetectionTrainer does not mix batches (MixUp and CutMix "
        "would have to mix the boxes too); set mixup_alpha and cutmix_alpha to 0"
    )
    assert not (tmp_path / "saved").exists()


def test_tiny_detector_refuses_a_number_of_classes_that_is_no_count():
    assert_refuses_numbers_of_classes_that_are_no_count("TinyDetector", {"width": 4})


def test_a_torchvision_detector_is_refused_naming_the_detection_tasks_model():
    """TorchvisionModel refuses torchvision's detectors (tests/test_transfer.py) and points at
    the model that does the task here."""
    with pytest.raises(ConfigValueError, match="the detection task's model is TinyDetector"):
        check_classifier("fasterrcnn_resnet50_fpn")

"""The segmentation worked example (data_loader/tasks/segmentation.py, model/unet.py,
configs/segmentation.json): PNG image and mask folders on disk, image and mask augmented
together as a function of (seed, epoch, index), per-pixel class counts and label checks, a
U-Net trained to a stated pixel accuracy and mIoU above the always-background baseline,
predict.py writing mask PNGs, export.py on another image size, resume and 2 processes."""

import functools
import hashlib
import json
import logging
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import (
    NUM_EXAMPLES,
    ROOT,
    assert_stopped_run_resumes_bit_exact,
    run_main,
    shrink,
    torchrun,
    validated_in_one_process,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import ExifTags, Image, ImageOps
from test_model import (
    assert_a_batch_of_one_trains,
    assert_refuses_numbers_of_classes_that_are_no_count,
)

from data_loader.tasks.segmentation import (
    MaskFolder,
    SegmentationDataLoader,
    image_transform,
    write_segmentation,
)
from model.loss import cross_entropy
from utils.data.data_summary import log_data_summary
from utils.data.sampler import SeededIndex
from utils.util import ConfigValueError, DataError

RUN = Path("models") / "Segment_Shapes"
NUM_CLASSES = 4  # background, disk, square, triangle


def segmentation_config(tmp_path: Path, data_dir: Path, **trainer: object) -> Path:
    """configs/segmentation.json shrunk: CPU, outputs in tmp_path, a narrow U-Net."""
    config = shrink(
        json.loads((ROOT / "configs/segmentation.json").read_text()), tmp_path / "saved"
    )
    config["data_loader"]["args"].update(data_dir=str(data_dir), batch_size=8)
    config["arch"]["args"]["widths"] = [4, 8]
    config["trainer"].update(tensorboard=False, **trainer)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def tiny_data(root: Path, size: int = 16) -> Path:
    return write_segmentation(root, sizes={"train": 12, "val": 4, "test": 4}, image_size=size)


# --- the joint transform: a function of (seed, epoch, index), image and mask together -----------


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_image_and_mask_flip_together_as_a_function_of_the_sample_seed(tmp_path, num_examples):
    data = SegmentationDataLoader(str(tiny_data(tmp_path / "data")), batch_size=4, seed=0)
    view, raw = data.view("train", augment=True), data.dataset("train")
    flips_seen = set()

    @settings(max_examples=num_examples)
    @given(index=st.integers(0, 11), seed=st.integers(0, 2**63 - 1))
    def check(index: int, seed: int) -> None:
        image, mask = view[SeededIndex(index, seed)]
        again_image, again_mask = view[SeededIndex(index, seed)]
        assert torch.equal(image, again_image) and torch.equal(mask, again_mask)
        plain_image, plain_mask = image_transform()(raw[index][0]), raw[index][1]
        # The one flip of (none, horizontal, vertical, both) that gives the mask gives the image.
        for dims in ([], [-1], [-2], [-2, -1]):
            flipped = plain_mask.flip(dims) if dims else plain_mask
            if torch.equal(flipped, mask):
                expected = plain_image.flip(dims) if dims else plain_image
                if torch.equal(expected, image):
                    flips_seen.add(tuple(dims))
                    return
        raise AssertionError(f"sample {index}, seed {seed}: image and mask flipped apart")

    check()
    assert len(flips_seen) > 1  # it augments at all (masks symmetric under a flip aside)
    assert view[SeededIndex(0, 1)][1].dtype == torch.int64


def test_an_epoch_gives_the_same_pairs_again_and_in_worker_processes(tmp_path):
    root = str(tiny_data(tmp_path / "data"))

    def epoch(number: int, num_workers: int = 0) -> list[torch.Tensor]:
        data = SegmentationDataLoader(root, batch_size=4, seed=3, num_workers=num_workers)
        loader = data.train_loader()
        loader.sampler.set_epoch(number)
        return [torch.cat([image.flatten(), mask.flatten()]) for image, mask in loader]

    first, other = epoch(1), epoch(2)
    for again in (epoch(1), epoch(1, num_workers=2)):
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_upper_case_pngs_are_data_and_hidden_files_are_not(tmp_path):
    """A camera's or Windows' IMG.PNG was skipped without a word (the split read *.png alone),
    and macOS's ._<name>.png beside each copied file (no image) would be read as one."""
    root = tiny_data(tmp_path / "data")
    for folder in ("images", "masks"):
        (root / "train" / folder / "00000.png").rename(root / "train" / folder / "00000.PNG")
    (root / "train" / "images" / "._00001.png").write_bytes(b"\x00\x05\x16\x07")
    data = SegmentationDataLoader(str(root), batch_size=4, seed=0)
    train = data.dataset("train")
    assert len(train) == 12
    assert all(train[index][0].size == (16, 16) for index in range(len(train)))


def test_an_image_that_is_not_a_png_is_counted_in_a_warning(tmp_path, caplog):
    # A JPEG among the PNG images has no sample: said, not silent; a text file is no image.
    root = tiny_data(tmp_path / "data")
    image = root / "train" / "images" / "00000.png"
    Image.open(image).save(image.with_suffix(".jpg"))
    image.unlink()
    (root / "train" / "images" / "notes.txt").write_text("not an image")
    data = SegmentationDataLoader(str(root), batch_size=4, seed=0)
    assert len(data.dataset("train")) == 11
    warning = f"{root / 'train' / 'images'}: left out 1 image files of a format not read (1 .jpg)"
    assert warning in caplog.text and "convert them to .png" in caplog.text


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("damage", ["truncated", "not an image"])
def test_an_unreadable_mask_is_a_data_error_naming_it(tmp_path, num_workers, damage):
    # PIL's UnidentifiedImageError or "image file is truncated" came out as a traceback.
    root = tiny_data(tmp_path / "data")
    broken = root / "train" / "masks" / "00001.png"
    broken.write_bytes(broken.read_bytes()[:60] if damage == "truncated" else b"GIF89a")
    data = SegmentationDataLoader(str(root), batch_size=4, seed=0, num_workers=num_workers)
    with pytest.raises(DataError) as error:
        list(data.train_loader())
    message = str(error.value)  # one line, also from a worker process
    assert message.startswith(f"{broken}: unreadable mask (") and "\n" not in message


def save_tagged(image: Image.Image, path: Path, orientation: int | None) -> None:
    """`image` as a PNG tagged with EXIF `orientation` (None: no tag), as some tools write them."""
    exif = Image.Exif()
    if orientation is not None:
        exif[ExifTags.Base.Orientation] = orientation
    image.save(path, exif=exif)


@settings(max_examples=24, deadline=None)
@given(orientation=st.integers(1, 8), height=st.integers(2, 12), width=st.integers(2, 12))
def test_an_image_and_its_mask_turned_by_the_same_exif_tag_stay_aligned(orientation, height, width):
    # The image is read upright, as a viewer shows it: its mask, turned the same way, must be too.
    classes = np.arange(height * width, dtype=np.uint8).reshape(height, width) % 4
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for kind in ("images", "masks"):
            (root / kind).mkdir()
        save_tagged(
            Image.fromarray(classes * 60).convert("RGB"), root / "images/a.png", orientation
        )
        save_tagged(Image.fromarray(classes), root / "masks/a.png", orientation)
        image, mask = MaskFolder(root)[0]
        with Image.open(root / "images/a.png") as stored:
            assert image.size == ImageOps.exif_transpose(stored).size
        assert torch.equal(torch.from_numpy(np.asarray(image)[..., 0] // 60).long(), mask)


def test_a_split_is_one_size_as_its_images_are_read_upright(tmp_path):
    # A 16 x 24 photo stored as 24 x 16 with a quarter-turn tag is read 16 x 24, as the others:
    # the size check at load time compares the sizes read, not those stored (which refused it).
    root = write_segmentation(tmp_path / "data", sizes={"train": 4}, image_size=16)
    images = np.zeros((16, 24, 3), np.uint8)  # stored (H, W) = (16, 24); upright 24 x 16
    for name in ("00000.png", "00001.png", "00002.png", "00003.png"):
        pair = (images, root / "train/images" / name), (images[..., 0], root / "train/masks" / name)
        for pixels, path in pair:
            save_tagged(Image.fromarray(pixels), path, orientation=6 if name == "00000.png" else 1)
        images = np.zeros((24, 16, 3), np.uint8)  # the others stored upright, H 24, W 16
    data = SegmentationDataLoader(str(root), batch_size=4, seed=0)
    (batch, masks), *_ = data.train_loader()
    assert batch.shape == (4, 3, 24, 16) and masks.shape == (4, 24, 16)


def test_an_exif_tag_on_the_image_alone_is_refused_in_one_line(tmp_path):
    # A square image turned by its tag and a mask read as stored: every pixel's class misplaced.
    root = tiny_data(tmp_path / "data")
    image_path = root / "train" / "images" / "00003.png"
    save_tagged(Image.open(image_path), image_path, orientation=6)
    data = SegmentationDataLoader(str(root), batch_size=4, seed=0)
    with pytest.raises(DataError) as error:
        data.dataset("train")[3]
    message = str(error.value)
    assert message.startswith(f"{image_path}: EXIF Orientation 6, but 1 in its mask ")
    assert "\n" not in message


# --- the hooks' defaults, as BaseDataLoader defines them ----------------------------------------


def test_classes_json_is_utf_8_with_or_without_a_byte_order_mark(tmp_path):
    """classes.json was read in the locale's encoding (cp1252 on Windows: "cœur" would come back
    as "cÅ“ur") and refused with a byte order mark (Notepad's UTF-8)."""
    data = tiny_data(tmp_path / "data")
    names = ["fond", "cœur", "carré", "三角"]
    for prefix in (b"", b"\xef\xbb\xbf"):
        (data / "classes.json").write_bytes(prefix + json.dumps(names, ensure_ascii=False).encode())
        assert SegmentationDataLoader(str(data), batch_size=4, seed=0).class_names() == names


def test_target_classes_default_reads_labels_and_integer_tensors_and_refuses_floats(tmp_path):
    data = SegmentationDataLoader(str(tiny_data(tmp_path / "data")), batch_size=4, seed=0)
    assert data.target_classes(3).tolist() == [3]
    assert data.target_classes(torch.tensor(2)).tolist() == [2]
    mask = torch.tensor([[0, 1], [255, 2]])
    assert data.target_classes(mask).tolist() == [0, 1, 255, 2]
    data.ignore_index = 255
    assert data.target_classes(mask).tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="float32"):
        data.target_classes(torch.zeros(2, 2))


def test_without_a_pair_transform_the_view_transforms_the_input_alone(tmp_path):
    data = SegmentationDataLoader(
        str(tiny_data(tmp_path / "data")), batch_size=4, seed=0, flip=False
    )
    assert data.pair_transform(augment=True) is None
    image, mask = data.view("train", augment=True)[SeededIndex(1, 7)]
    raw_image, raw_mask = data.dataset("train")[1]
    assert torch.equal(image, image_transform()(raw_image)) and torch.equal(mask, raw_mask)


# --- per-pixel targets: class counts, label check, samplers, folds ------------------------------


def test_the_data_summary_counts_pixels_per_named_class(tmp_path, caplog):
    data = SegmentationDataLoader(str(tiny_data(tmp_path / "data")), batch_size=4, seed=0)
    with caplog.at_level(logging.INFO):
        log_data_summary(data, logging.getLogger("summary"), epoch=1)
    masks = np.stack(
        [np.asarray(Image.open(p)) for p in sorted((tmp_path / "data/train/masks").glob("*"))]
    )
    counts = np.bincount(masks.reshape(-1), minlength=NUM_CLASSES)
    assert (
        f"12 samples; per class (occurrences in the targets): background {counts[0]}, "
        f"disk {counts[1]}, square {counts[2]}, triangle {counts[3]}"
    ) in caplog.text


def test_target_classes_leaves_out_ignore_index_and_the_check_reads_masks(tmp_path):
    root = tiny_data(tmp_path / "data")
    mask_path = root / "train" / "masks" / "00000.png"
    mask = np.asarray(Image.open(mask_path)).copy()
    mask[0, :3] = 255  # unlabelled pixels
    Image.fromarray(mask).save(mask_path)
    data = SegmentationDataLoader(str(root), batch_size=4, seed=0, ignore_index=255)
    assert 255 not in data.target_classes(torch.from_numpy(mask.astype(np.int64)))
    data.check(NUM_CLASSES)  # 255 is no class: accepted
    with pytest.raises(DataError, match=r"256 classes, but arch.args.num_classes is 4"):
        SegmentationDataLoader(str(root), batch_size=4, seed=0).check(4)  # 255 without ignore
    mask[0, :3] = 4
    Image.fromarray(mask).save(mask_path)
    with pytest.raises(DataError, match=r"5 classes, but arch.args.num_classes is 4"):
        SegmentationDataLoader(str(root), batch_size=4, seed=0, ignore_index=255).check(4)


def test_a_16_bit_image_keeps_its_contrast_in_training_and_in_predict(tmp_path):
    """A 16-bit grayscale PNG (microscopy, medical) is scaled to 8 bits, not clipped at 255,
    which made every pixel above 255 of 65535 white: the training input and predict.py's."""
    root = tiny_data(tmp_path / "data")
    values = np.linspace(0, 65535, 16 * 16).astype(np.uint16).reshape(16, 16)
    path = root / "train" / "images" / "00000.png"
    Image.fromarray(values).save(path)
    assert Image.open(path).mode == "I;16"
    image, _ = SegmentationDataLoader(str(root), batch_size=4, seed=0).dataset("train")[0]
    expected = np.repeat((values >> 8).astype(np.uint8)[..., None], 3, axis=2)
    assert (np.asarray(image) == expected).all()
    (name,), (inputs,) = SegmentationDataLoader.read_inputs(path, {}, None)
    assert name == str(path) and torch.equal(inputs, image_transform()(Image.fromarray(expected)))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"flip": "false"}, "flip: must be true or false, got 'false'"),  # a string: truthy
        ({"ignore_index": "255"}, "ignore_index: must be an integer or null, got '255'"),
        ({"ignore_index": True}, "ignore_index: must be an integer or null, got True"),
    ],
)
def test_a_flip_or_ignore_index_of_another_type_is_refused(tmp_path, args, message):
    with pytest.raises(ConfigValueError, match=re.escape(message)):
        SegmentationDataLoader(str(tmp_path), batch_size=4, seed=0, **args)


def test_a_mask_class_past_the_model_is_refused_before_anything_is_written(tmp_path):
    root = tiny_data(tmp_path / "data")
    config = segmentation_config(tmp_path, root)
    result = run_main("train.py", "-c", str(config), "--set", "arch.args.num_classes=3")
    assert result.returncode != 0
    assert "4 classes, but arch.args.num_classes is 3" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "saved" / "models").exists()


def test_a_mask_class_without_a_name_is_refused_before_anything_is_written(tmp_path):
    """classes.json names 3 classes, the masks hold 4 (the model has 4 outputs): the summary,
    the confusion matrix and predict.py's shares would leave the triangles out, silently."""
    root = tiny_data(tmp_path / "data")
    (root / "classes.json").write_text(json.dumps(["background", "disk", "square"]))
    config = segmentation_config(tmp_path, root)
    overrides = ["--set", 'metrics=["accuracy"]', "--set", "trainer.monitor=min val/loss"]
    result = run_main("train.py", "-c", str(config), *overrides)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "class index 3" in result.stderr and "3 class names" in result.stderr
    assert not (tmp_path / "saved" / "models").exists()


# --- void pixels: ignore_index reaches the loss and the metrics --------------------------------


def with_void_pixels(root: Path) -> Path:
    """The tiny data with each training and validation mask's first row unlabelled (255)."""
    for split in ("train", "val"):
        for path in sorted((root / split / "masks").glob("*.png")):
            mask = np.asarray(Image.open(path)).copy()
            mask[0, :] = 255
            Image.fromarray(mask).save(path)
    return root


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_the_loss_leaves_void_pixels_out_and_is_exact_over_any_batch_cut(num_examples):
    """cross_entropy with ignore_index: each image's mean over its labelled pixels, averaged
    over the images, so loss x batch size summed over any cut of the batches is the whole's
    (val/loss is exact), the void pixels' logits change nothing, and without void pixels it is
    torch's plain mean."""

    @settings(max_examples=num_examples, deadline=None)
    @given(
        shape=st.tuples(st.integers(1, 6), st.integers(2, 4), st.integers(1, 4), st.integers(1, 4)),
        void=st.floats(0.0, 1.0),
        label_smoothing=st.sampled_from([0.0, 0.1]),
        seed=st.integers(0, 2**31 - 1),
        cut=st.integers(0, 6),
    )
    def check(shape, void, label_smoothing, seed, cut) -> None:
        generator = torch.Generator().manual_seed(seed)
        num_images, num_classes, height, width = shape
        logits = torch.randn(shape, generator=generator, dtype=torch.float64)
        target = torch.randint(num_classes, (num_images, height, width), generator=generator)
        is_void = torch.rand(target.shape, generator=generator) < void
        target[is_void] = 255
        loss = functools.partial(cross_entropy, label_smoothing=label_smoothing, ignore_index=255)
        # The reference: torch's loss on each image's labelled pixels alone, 0 for an image
        # with none; the mean over the images.
        per_image = [
            F.cross_entropy(
                logits[i].permute(1, 2, 0)[target[i] != 255],
                target[i][target[i] != 255],
                label_smoothing=label_smoothing,
            )
            if (target[i] != 255).any()
            else torch.zeros((), dtype=torch.float64)
            for i in range(num_images)
        ]
        whole = loss(logits, target)
        torch.testing.assert_close(whole, torch.stack(per_image).mean())
        cut = min(cut, num_images - 1)
        if cut:
            parts = [(logits[:cut], target[:cut]), (logits[cut:], target[cut:])]
            summed = sum(loss(output, labels) * len(labels) for output, labels in parts)
            torch.testing.assert_close(summed, whole * num_images)
        scrambled = torch.where(is_void.unsqueeze(1), logits * 7 + 3, logits)
        torch.testing.assert_close(loss(scrambled, target), whole)
        if not is_void.any():
            plain = F.cross_entropy(logits, target, label_smoothing=label_smoothing)
            torch.testing.assert_close(whole, plain)

    check()


def test_void_pixels_train_with_the_datas_ignore_index_and_a_metric_that_counts_them_is_refused(
    tmp_path,
):
    """data_loader.args.ignore_index reaches cross_entropy, MeanIoU and PixelAccuracy without
    being repeated in their args (before, the loss raised "Target 255 is out of bounds" with a
    traceback); accuracy, which would score void pixels as wrong, is refused in one line."""
    root = with_void_pixels(tiny_data(tmp_path / "data"))
    config = segmentation_config(tmp_path, root, epochs=1)
    ignore = ("--set", "data_loader.args.ignore_index=255")
    result = run_main("train.py", "-c", str(config), *ignore)
    assert result.returncode != 0
    assert result.stderr.strip().endswith(
        "metrics[0]: accuracy cannot leave out the targets equal to "
        "data_loader.args.ignore_index (255); name one that takes ignore_index (cross_entropy, "
        "nll_loss; PixelAccuracy, MeanIoU, F1) or give yours that argument"
    )
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "saved" / "models").exists()
    metrics = json.dumps(
        [
            {"type": name, "args": {"num_classes": NUM_CLASSES}}
            for name in ("PixelAccuracy", "MeanIoU")
        ]
    )
    result = run_main(
        "train.py", "-c", str(config), *ignore, "--set", f"metrics={metrics}", "--run-id", "run"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report_path = tmp_path / "val.json"
    checkpoint = tmp_path / "saved" / RUN / "run" / "checkpoint-epoch1.pth"
    result = run_main(
        "test.py", "-r", str(checkpoint), "--split", "val", "--json", str(report_path)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reported = json.loads(report_path.read_text())["metrics"]
    predicted = tmp_path / "predicted"
    result = run_main(
        "predict.py",
        "-r",
        str(checkpoint),
        str(root / "val" / "images"),
        "--out-dir",
        str(predicted),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    right = labelled = 0  # over the labelled pixels of every validation mask
    for truth_path in sorted((root / "val" / "masks").glob("*.png")):
        truth = np.asarray(Image.open(truth_path))
        predicted_mask = np.asarray(Image.open(predicted / truth_path.name))
        right += int(((truth == predicted_mask) & (truth != 255)).sum())
        labelled += int((truth != 255).sum())
    assert labelled < 4 * 16 * 16  # the first rows are void
    assert reported["val/PixelAccuracy"] == pytest.approx(right / labelled, abs=1e-9)


@pytest.mark.parametrize("split", ["train", "val"])
def test_images_of_several_sizes_are_refused_before_anything_is_written(tmp_path, split):
    """Batches stack their images: one of another size is named, not a torch.stack traceback,
    and before the run folder is made. It was refused at the first batch that mixed sizes: an
    epoch of training in for a validation image, leaving a run folder of config.json alone.
    With a batch of 1 the sizes may differ."""
    data = tiny_data(tmp_path / "data")
    pixels = np.zeros((20, 24, 3), np.uint8)  # 00003.png: 24 x 20, the others 16 x 16
    Image.fromarray(pixels).save(data / split / "images" / "00003.png")
    Image.fromarray(pixels[..., 0]).save(data / split / "masks" / "00003.png")
    result = run_main("train.py", "-c", str(segmentation_config(tmp_path, data, epochs=1)))
    assert result.returncode == 2 and result.stderr == (
        f"error: {data / split / 'images'}: images of several sizes (00000.png is 16 x 16, "
        "00003.png 24 x 20); a batch stacks them: give every image of a split one size, or set "
        "data_loader.args.batch_size to 1\n"
    )
    assert not (tmp_path / "saved").exists()
    data_loader = SegmentationDataLoader(str(data), batch_size=1, seed=0)
    batches = data_loader.train_loader() if split == "train" else data_loader.eval_loader(split)
    assert sorted({tuple(images.shape[-2:]) for images, _ in batches}) == [(16, 16), (20, 24)]


def test_weighted_sampling_is_refused_in_one_line_and_folds_deal_masks_without_classes(tmp_path):
    root = str(tiny_data(tmp_path / "data"))
    weighted = SegmentationDataLoader(root, batch_size=4, seed=0, sampler="weighted")
    with pytest.raises(DataError, match="not one label; the weighted sampler needs one"):
        weighted.train_sampler()
    folds = [SegmentationDataLoader(root, batch_size=4, seed=0, folds=3, fold=k) for k in range(3)]
    validation = [data.split_indices()[1] for data in folds]
    assert sorted(np.concatenate(validation).tolist()) == list(range(12))
    assert [len(indices) for indices in validation] == [4, 4, 4]


# --- predict.py and export.py on a trained checkpoint -----------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A U-Net trained for 1 epoch on 16x16 images (12 of them)."""
    tmp_path = tmp_path_factory.mktemp("segmentation")
    config = segmentation_config(tmp_path, tiny_data(tmp_path / "data"), epochs=1)
    result = run_main("train.py", "-c", str(config), "--run-id", "tiny")
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path / "saved" / RUN / "tiny" / "checkpoint-epoch1.pth"


def test_predict_writes_a_mask_png_per_image_of_any_size(checkpoint, tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for name, size in [("a", 16), ("b", 24), ("c", 16)]:  # two sizes, batched by shape
        pixels = np.random.default_rng(size).integers(0, 256, (size, size + 8, 3), np.uint8)
        Image.fromarray(pixels).save(inputs / f"{name}.png")
    out, out_dir = tmp_path / "rows.csv", tmp_path / "masks"
    args = ["-r", str(checkpoint), str(inputs), "--out", str(out), "--out-dir", str(out_dir)]
    result = run_main("predict.py", *args)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) == 3
    header, *rows = out.read_text().splitlines()
    assert header == "path,mask,share_background,share_disk,share_square,share_triangle"
    for row, (name, size) in zip(rows, [("a", 16), ("b", 24), ("c", 16)], strict=True):
        mask = np.asarray(Image.open(out_dir / f"{name}.png"))
        assert mask.shape == (size, size + 8) and mask.max() < NUM_CLASSES
        shares = [float(value) for value in row.split(",")[2:]]
        assert sum(shares) == pytest.approx(1, abs=1e-3)
    as_json = tmp_path / "rows.json"
    assert (
        run_main("predict.py", *args[:2], str(inputs / "b.png"), "--out", str(as_json)).returncode
        == 0
    )
    (row,) = json.loads(as_json.read_text())  # without --out-dir: no mask file
    assert list(row)[:2] == ["path", "share_background"] and "mask" not in row
    # An --out-dir that is a file is refused in one line, before any work.
    refused = run_main("predict.py", "-r", str(checkpoint), str(inputs), "--out-dir", str(out))
    assert (
        refused.returncode == 2
        and "--out-dir" in refused.stderr
        and "not a folder" in refused.stderr
    )


def test_predict_reads_every_image_a_folder_or_glob_names(checkpoint, tmp_path):
    """Every image file predict.py documents (.bmp, .tif, .webp too), in a folder or a glob."""
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for name in ("a.png", "b.bmp", "c.tif", "d.webp", "E.PNG"):
        pixels = np.random.default_rng(len(name)).integers(0, 256, (16, 16, 3), np.uint8)
        Image.fromarray(pixels).save(inputs / name, lossless=True)
    # Hidden files are not inputs: macOS's ._<name> beside a copied file, a notebook's folder.
    (inputs / "._a.png").write_bytes(b"\x00\x05\x16\x07")
    (inputs / ".ipynb_checkpoints").mkdir()
    (inputs / ".ipynb_checkpoints" / "x.png").write_bytes(b"not an image")
    args = ["-r", str(checkpoint), "--out-dir", str(tmp_path / "masks")]
    result = run_main("predict.py", *args, str(inputs))
    assert result.returncode == 0, result.stderr
    assert sorted(files_under(tmp_path / "masks")) == ["E.png", "a.png", "b.png", "c.png", "d.png"]
    globbed = run_main("predict.py", *args[:2], str(inputs / "*.bmp"))
    assert globbed.returncode == 0, globbed.stderr
    assert [line.split()[0] for line in globbed.stdout.splitlines()] == [str(inputs / "b.bmp")]


def test_predict_refuses_an_image_size_the_unet_cannot_take_in_one_line(checkpoint, tmp_path):
    """The U-Net takes multiples of its stride (2 here): a 15 x 18 image is named, no traceback."""
    odd = tmp_path / "odd.png"
    Image.fromarray(np.zeros((15, 18, 3), np.uint8)).save(odd)
    result = run_main("predict.py", "-r", str(checkpoint), str(odd))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert str(odd) in result.stderr and "multiples of 2" in result.stderr


@pytest.mark.parametrize("num_classes", [4, 256, 300])
def test_a_predicted_mask_png_holds_the_argmax_of_any_number_of_classes(tmp_path, num_classes):
    """The mask PNG's pixels are the logits' argmax, past 255 too (a 16-bit PNG, not wrapped)."""
    classes = torch.tensor([[0, num_classes - 1, 3], [num_classes // 2, 1, num_classes - 2]])
    logits = F.one_hot(classes, num_classes).permute(2, 0, 1)[None].float()  # (1, C, 2, 3)
    names = [f"class_{index}" for index in range(num_classes)]
    (row,) = SegmentationDataLoader.prediction_rows(
        ["in/x.jpg"], logits, class_names=names, out_dir=tmp_path
    )
    mask = np.asarray(Image.open(tmp_path / "x.png")).astype(np.int64)
    assert row["mask"] == str(tmp_path / "x.png") and (mask == classes.numpy()).all()
    share = (classes == num_classes - 1).float().mean().item()
    assert row[f"share_class_{num_classes - 1}"] == pytest.approx(share, abs=1e-4)


def files_under(folder: Path) -> dict[str, str]:
    """Every file under folder (relative name) -> its sha256."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_predict_out_dir_replaces_no_input_and_no_file_without_force(checkpoint, tmp_path):
    """A refused --out-dir is one error line, exit 2, and nothing under tmp_path changed."""
    images = tmp_path / "images"
    for name in ("a/x", "b/x", "p", "q"):  # a/x.png and b/x.png: one mask name, x.png
        (images / name).parent.mkdir(parents=True, exist_ok=True)
        pixels = np.random.default_rng(len(name)).integers(0, 256, (16, 16, 3), np.uint8)
        Image.fromarray(pixels).save(images / f"{name}.png")
    (tmp_path / "masks").mkdir()
    (tmp_path / "masks" / "q.png").write_bytes(b"the user's own file")

    def refused(*args: str, expected: str) -> None:
        before = files_under(tmp_path)
        result = run_main("predict.py", "-r", str(checkpoint), *args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
        assert expected in result.stderr and result.stdout == ""
        assert files_under(tmp_path) == before
        assert not (tmp_path / "new").exists()  # an --out-dir to make is not made either

    x_a, x_b = images / "a" / "x.png", images / "b" / "x.png"
    refused(str(images / "a"), str(images / "b"), "--out-dir", str(tmp_path / "new"),
            expected=f"{x_a} and {x_b} would both write {tmp_path / 'new' / 'x.png'}")  # fmt: skip
    # The inputs themselves are never replaced, with --force too (a/x.png: its own mask name).
    for force in ([], ["--force"]):
        refused(str(images / "a"), "--out-dir", str(images / "a"), *force,
                expected=f"{x_a} is an input")  # fmt: skip
    # p.png's mask is new, q.png's exists: refused before p.png's is written.
    refused(str(images / "p.png"), str(images / "q.png"), "--out-dir", str(tmp_path / "masks"),
            expected=f"{tmp_path / 'masks' / 'q.png'} already exists; pass --force")  # fmt: skip
    forced = run_main(
        "predict.py", "-r", str(checkpoint), str(images / "p.png"), str(images / "q.png"),
        "--out-dir", str(tmp_path / "masks"), "--force",
    )  # fmt: skip
    assert forced.returncode == 0, forced.stderr
    assert sorted(files_under(tmp_path / "masks")) == ["p.png", "q.png"]
    assert np.asarray(Image.open(tmp_path / "masks" / "q.png")).shape == (16, 16)


def test_the_exported_unet_runs_on_another_image_size(checkpoint, tmp_path):
    out = tmp_path / "unet.pt2"
    result = run_main("export.py", "-r", str(checkpoint), "--out", str(out))
    assert result.returncode == 0, result.stderr
    program = torch.export.load(out).module()
    model = torch.load(checkpoint, weights_only=True)
    images = torch.randn(2, 3, 48, 40)  # the example inputs are 32x32
    from build import load_inference_model

    eager, _, _ = load_inference_model(checkpoint)
    with torch.no_grad():
        difference = (program(images) - eager(images)).abs().max().item()
    assert difference < 1e-4 and model["config"]["arch"]["type"] == "UNet"


def test_a_five_level_unet_exports_with_a_dynamic_height_and_width(tmp_path):
    """The original U-Net's depth, a stride of 16: 32 x 32 example inputs are checked cut to 16,
    where the deepest level is 1 x 1, a size an exported file refuses (torch.export assumes a
    dynamic size is not 1); the example is 64 x 64, checked at 32 and 128."""
    data = write_segmentation(tmp_path / "data", sizes={"train": 8, "val": 4, "test": 4})
    config = segmentation_config(tmp_path, data, epochs=1)
    shrunk = json.loads(config.read_text())
    shrunk["arch"]["args"]["widths"] = [2] * 5
    config.write_text(json.dumps(shrunk))
    assert run_main("train.py", "-c", str(config), "--run-id", "deep").returncode == 0
    checkpoint = tmp_path / "saved" / RUN / "deep" / "checkpoint-epoch1.pth"
    result = run_main("export.py", "-r", str(checkpoint), "--out", str(tmp_path / "unet.pt2"))
    assert result.returncode == 0, result.stderr
    assert "height 32, height 128, width 32, width 128" in result.stdout


# --- end to end: the stated figures (slow) ------------------------------------------------------


def confusion(prediction_dir: Path, mask_dir: Path) -> np.ndarray:
    """counts[true class, predicted class] over every pixel of the masks in mask_dir."""
    counts = np.zeros((NUM_CLASSES, NUM_CLASSES), np.int64)
    for truth_path in sorted(mask_dir.glob("*.png")):
        truth = np.asarray(Image.open(truth_path)).astype(np.int64)
        predicted = np.asarray(Image.open(prediction_dir / truth_path.name)).astype(np.int64)
        counts += np.bincount(
            (truth * NUM_CLASSES + predicted).reshape(-1), minlength=NUM_CLASSES**2
        ).reshape(NUM_CLASSES, NUM_CLASSES)
    return counts


def mean_iou(counts: np.ndarray) -> float:
    """The mean over classes of TP / (TP + FP + FN), from counts[true, predicted]."""
    true_positives = np.diag(counts)
    union = counts.sum(0) + counts.sum(1) - true_positives
    return float(np.mean(true_positives / np.maximum(union, 1)))


@pytest.mark.slow
def test_the_unet_beats_the_always_background_baseline(tmp_path):
    root = write_segmentation(tmp_path / "data", sizes={"train": 256, "val": 32, "test": 64})
    config = segmentation_config(tmp_path, root, epochs=20)
    overrides = {"arch.args.widths": [16, 32, 64]}  # the shipped U-Net
    flags = [
        item for key, value in overrides.items() for item in ("--set", f"{key}={json.dumps(value)}")
    ]
    started = time.perf_counter()
    result = run_main("train.py", "-c", str(config), "--run-id", "run", *flags)
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-3000:]
    best = tmp_path / "saved" / RUN / "run" / "model_best.pth"
    report_path = tmp_path / "test.json"
    result = run_main("test.py", "-r", str(best), "--split", "test", "--json", str(report_path))
    assert result.returncode == 0, result.stderr[-3000:]
    reported = json.loads(report_path.read_text())["metrics"]
    pixel_accuracy = reported["test/accuracy"]
    predicted = tmp_path / "predicted"
    result = run_main(
        "predict.py", "-r", str(best), str(root / "test" / "images"), "--out-dir", str(predicted)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    counts = confusion(predicted, root / "test" / "masks")
    background = counts[0].sum() / counts.sum()  # the always-background pixel accuracy
    baseline_counts = np.zeros_like(counts)
    baseline_counts[:, 0] = counts.sum(1)
    print(
        f"train {seconds:.1f} s; test pixel accuracy {pixel_accuracy:.4f} (baseline "
        f"{background:.4f}); mIoU {mean_iou(counts):.4f} (baseline {mean_iou(baseline_counts):.4f})"
    )
    # predict.py's masks are the ones test.py scored: the same pixel accuracy.
    assert np.trace(counts) / counts.sum() == pytest.approx(pixel_accuracy, abs=1e-6)
    # The shipped MeanIoU, whole-split counts over batches, is the masks' confusion matrix's.
    assert reported["test/MeanIoU"] == pytest.approx(mean_iou(counts), abs=1e-9)
    assert pixel_accuracy > background + 0.1  # about 0.80 -> above 0.90
    assert mean_iou(counts) > mean_iou(baseline_counts) + 0.5  # about 0.20 -> above 0.70


@pytest.mark.slow
def test_a_run_stopped_mid_epoch_resumes_bit_exact(tmp_path, stop_at):
    root = write_segmentation(tmp_path / "data", sizes={"train": 32, "val": 8, "test": 8})
    config = segmentation_config(tmp_path, root, type="StopAt", deterministic=True)
    # 4 steps per epoch: stopped inside epoch 2.
    assert_stopped_run_resumes_bit_exact(config, tmp_path / "saved" / RUN, stop_at_step=6)


@pytest.mark.slow
def test_two_processes_validate_as_one_process_does(tmp_path):
    root = write_segmentation(tmp_path / "data", sizes={"train": 32, "val": 12, "test": 8})
    config = segmentation_config(tmp_path, root, epochs=1)
    torchrun("-c", str(config), "--run-id", "ddp")
    checkpoint = tmp_path / "saved" / RUN / "ddp" / "checkpoint-epoch1.pth"
    report, recorded = validated_in_one_process(checkpoint, tmp_path / "val.json")
    assert report["num_samples"] == 12
    assert report["metrics"]["val/accuracy"] == recorded["val/accuracy"]
    assert report["metrics"]["val/loss"] == pytest.approx(recorded["val/loss"], rel=1e-6)


def test_unet_refuses_a_number_of_classes_that_is_no_count_and_trains_a_batch_of_one():
    assert_refuses_numbers_of_classes_that_are_no_count("UNet", {})
    assert_a_batch_of_one_trains("UNet", {"num_classes": 3}, (3, 16, 16))

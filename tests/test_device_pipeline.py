"""The device pipelines against the DataLoader path they replace: pipeline "device" (a split held
on the training device, augmented there a batch at a time, for CIFAR-size data; its decoded-image
cache for image folders) and decode "device" (JPEGs decoded on the training device). Here the
device is the CPU: the same code runs on a GPU."""

import importlib.util
import json
import os
import signal
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, shrink
from PIL import Image

import data_loader.image_cache
import train
import trainer as trainer_module
from base.base_data_loader import DataError
from data_loader.data_loaders import ImageFolderDataLoader, SyntheticDataLoader
from data_loader.device_decode import EncodedImages, erase_randomly
from data_loader.device_pipeline import crop_and_flip
from data_loader.image_loader import load_image_tensor
from data_loader.transforms import CIFAR10_MEAN, CIFAR10_STD
from trainer import Trainer
from utils import ConfigValueError
from utils.batches import epoch_batches

MEAN = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
STD = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)


def synthetic(**kwargs) -> SyntheticDataLoader:
    """60 training samples, 10 of them for validation, in batches of 8."""
    args = {"batch_size": 8, "seed": 0, "num_train": 60, "num_test": 20, "validation_split": 10}
    return SyntheticDataLoader(**{**args, **kwargs})


def all_batches(loader) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = zip(*loader, strict=True)
    return torch.cat(images), torch.cat(labels)


def to_pixels(images: torch.Tensor) -> torch.Tensor:
    """Normalised CIFAR images (B, 3, H, W) back to their uint8 pixels."""
    return ((images * STD + MEAN) * 255).round().to(torch.uint8)


def all_crops(image: torch.Tensor, padding: int = 4) -> torch.Tensor:
    """Every crop with zero padding of a (C, H, W) image, flipped and not: (2 x 81, C, H, W)."""
    _, height, width = image.shape
    padded = torch.nn.functional.pad(image, (padding,) * 4)
    span = range(2 * padding + 1)
    crops = torch.stack([padded[:, t : t + height, s : s + width] for t in span for s in span])
    return torch.cat([crops, crops.flip(-1)])


# --- pipeline "device": the same batches as the DataLoader path -------------------------------

EVALUATION_CASES = {
    "validation_split": {},
    "fold": {"folds": 3, "fold": 1},
    "resized": {"image_size": 40},
    "eval_image_size": {"eval_image_size": 24},
}


@pytest.mark.parametrize("args", EVALUATION_CASES.values(), ids=EVALUATION_CASES.keys())
def test_evaluation_batches_equal_the_dataloader_paths_bit_for_bit(args):
    standard, device = synthetic(**args), synthetic(pipeline="device", **args)
    for split in ("val", "test"):
        expected_images, expected_labels = all_batches(standard.eval_loader(split))
        images, labels = all_batches(device.eval_loader(split))
        assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)


SAMPLER_CASES = {
    "random": {},
    "replacement": {"replacement": True},
    "num_samples": {"num_samples": 30},
    "sequential": {"sampler": "sequential"},
    "weighted": {"sampler": "weighted"},
}


@pytest.mark.parametrize("args", SAMPLER_CASES.values(), ids=SAMPLER_CASES.keys())
def test_batches_follow_the_sampler_of_each_rank(args):
    samples = synthetic(**args).view("train", augment=False)
    for rank in (0, 1):
        data = synthetic(pipeline="device", num_replicas=2, rank=rank, **args)
        sampler = data.train_sampler()
        # The training split and sampler, without augmentation: exactly the DataLoader's samples.
        loader = data.loader("train", sampler, augment=False)
        sampler.set_epoch(2)
        order = list(sampler)
        images, labels = all_batches(loader)
        assert len(loader) == -(-len(order) // 8)
        assert torch.equal(images, torch.stack([samples[index][0] for index in order]))
        assert labels.tolist() == [samples[index][1] for index in order]


@pytest.mark.parametrize("size", [32, 30])  # padded rows of whole 4-byte words, and not
def test_training_batches_are_crops_and_flips_of_the_sampled_images(size):
    data = synthetic(pipeline="device", image_size=size)
    loader = data.train_loader()
    loader.sampler.set_epoch(1)
    order = list(loader.sampler)
    images, labels = all_batches(loader)
    sources = data.device_split("train", size)[0][order]  # uint8 (N, 3, size, size)
    assert labels.tolist() == data.labels("train")[order].tolist()
    for output, source in zip(to_pixels(images), sources, strict=True):
        assert (all_crops(source) == output).flatten(1).all(1).any()
    # A new epoch draws new crops; the same epoch draws the same ones.
    loader.sampler.set_epoch(2)
    assert not torch.equal(all_batches(loader)[0], images)
    loader.sampler.set_epoch(1)
    assert torch.equal(all_batches(loader)[0], images)


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_pass_started_later_is_the_tail_of_the_whole_pass(drop_last):
    loader = synthetic(pipeline="device", num_train=70).train_loader(drop_last=drop_last)
    loader.sampler.set_epoch(3, 1)
    whole = list(loader)  # 60 training samples: 7 batches of 8 and one of 4
    assert len(whole) == len(loader) == (7 if drop_last else 8)
    loader.sampler.set_epoch(3, 1, start=3 * 8)
    tail = list(loader)
    assert len(tail) == len(whole) - 3
    for (images, labels), (expected_images, expected_labels) in zip(tail, whole[3:], strict=True):
        assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)


def test_len_epoch_spans_passes_and_a_resume_skips_by_index():
    loader = synthetic(pipeline="device").train_loader()  # 50 samples: 7 batches a pass
    whole = list(epoch_batches(loader, 2, 0, 10, lambda: None))
    resumed = list(epoch_batches(loader, 2, 8, 10, lambda: None))  # from pass 2's second batch
    assert len(whole) == 10 and len(resumed) == 2
    for (images, labels), (expected_images, expected_labels) in zip(
        resumed, whole[8:], strict=True
    ):
        assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)
    assert not torch.equal(whole[0][0], whole[7][0])  # pass 2 is another order


def test_crop_and_flip_draws_every_offset_and_flips_half():
    # Pixel values that give their own position: channel 0 the row, channel 1 the column.
    rows, columns = torch.meshgrid(torch.arange(32), torch.arange(32), indexing="ij")
    image = torch.stack([rows + 10, columns + 10, torch.zeros_like(rows)]).to(torch.uint8)
    outputs = crop_and_flip(image.expand(4000, -1, -1, -1), torch.Generator().manual_seed(0))
    # The centre pixel is inside the image for every offset: it says where the crop starts.
    top = outputs[:, 0, 16, 16].long() - 10 - 16 + 4
    flipped = outputs[:, 1, 16, 17] < outputs[:, 1, 16, 16]
    column = outputs[:, 1, 16, 16].long() - 10
    left = torch.where(flipped, column - 11, column - 12)
    for offsets in (top, left):
        shares = torch.bincount(offsets, minlength=9) / 4000
        assert len(shares) == 9 and shares.min() > 0.08 and shares.max() < 0.15  # uniform: 0.111
    assert 0.45 < flipped.float().mean() < 0.55
    padded = torch.nn.functional.pad(image, (4, 4, 4, 4))
    for index in range(0, 4000, 37):  # each output is that crop of the padded image
        crop = padded[:, top[index] : top[index] + 32, left[index] : left[index] + 32]
        assert torch.equal(outputs[index], crop.flip(-1) if flipped[index] else crop)


REFUSED = {
    "imagenet": ({"preset": "imagenet"}, 'only for preset "cifar"'),
    "auto_augment": ({"auto_augment": "trivialaugment"}, 'auto_augment: not with pipeline "dev'),
    "random_erasing": ({"random_erasing": 0.25}, 'random_erasing: not with pipeline "device"'),
    "both": ({"decode": "device"}, 'decode "device" streams files; pipeline "device" holds'),
}


@pytest.mark.parametrize(("args", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_what_the_device_pipeline_does_not_do_is_refused(tmp_path, args, message):
    (tmp_path / "train").mkdir()
    with pytest.raises(ConfigValueError, match=message):
        ImageFolderDataLoader(
            str(tmp_path), batch_size=4, seed=0, pipeline="device", **{"preset": "cifar", **args}
        )
    with pytest.raises(ConfigValueError, match="pipeline must be one of dataloader, device"):
        synthetic(pipeline="gpu")
    with pytest.raises(ConfigValueError, match="decode must be one of pil, device"):
        ImageFolderDataLoader(str(tmp_path), batch_size=4, seed=0, decode="nvjpeg")


# --- image folders: the decoded-image cache, and decoding on the device -----------------------


def write_images(root: Path, suffixes: dict[str, str], *, size: int = 36, count: int = 3) -> Path:
    """root/<split>/<class>/<n><suffix> for the classes a, b, c, `count` images each: smooth
    colour fields (JPEG keeps them close to what was written); suffixes: {split: suffix}."""
    rng = np.random.default_rng(0)
    for split, suffix in suffixes.items():
        for name in ("a", "b", "c"):
            (root / split / name).mkdir(parents=True)
            for index in range(count):
                coarse = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
                image = Image.fromarray(coarse).resize((size, size), Image.Resampling.BICUBIC)
                image.save(root / split / name / f"{index}{suffix}")
    return root


def test_an_image_folder_is_decoded_once_into_the_cache(tmp_path, monkeypatch, caplog):
    root = write_images(tmp_path / "images", {"train": ".png", "val": ".png"})
    args = {"batch_size": 4, "seed": 0, "preset": "cifar", "pipeline": "device"}
    data = ImageFolderDataLoader(str(root), **args)
    data.prepare_data()  # what train.py runs once per node
    cache = root / ".cache"
    train_file, val_file = (next(cache.glob(f"{split}-32px-*.pt")) for split in ("train", "val"))
    standard = ImageFolderDataLoader(str(root), batch_size=4, seed=0, preset="cifar")
    assert torch.equal(all_batches(data.val_loader())[0], all_batches(standard.val_loader())[0])

    # The next run reads the files back: nothing is decoded.
    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded again")

    monkeypatch.setattr(data_loader.image_cache, "decode_split", no_decoding)
    again = ImageFolderDataLoader(str(root), **args)
    again.prepare_data()
    with caplog.at_level("INFO", logger="data"):
        assert torch.equal(all_batches(again.val_loader())[0], all_batches(data.val_loader())[0])
    assert f"Decoded images: reusing {val_file}" in caplog.text
    monkeypatch.undo()

    # A changed file makes a new fingerprint: that split is decoded again, its old file removed.
    changed = root / "train" / "b" / "1.png"
    os.utime(changed, ns=(changed.stat().st_atime_ns, changed.stat().st_mtime_ns + 10**9))
    ImageFolderDataLoader(str(root), **args).prepare_data()
    assert next(cache.glob("val-32px-*.pt")) == val_file
    (new_train_file,) = cache.glob("train-32px-*.pt")
    assert new_train_file != train_file


def test_an_unwritable_cache_folder_is_a_warning(tmp_path, caplog):
    root = write_images(tmp_path / "images", {"train": ".png"})
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    data = ImageFolderDataLoader(
        str(root), batch_size=4, seed=0, preset="cifar", pipeline="device", cache_dir=not_a_folder
    )
    with caplog.at_level("WARNING", logger="data"):
        images, labels = all_batches(data.train_loader())
    assert images.shape == (9, 3, 32, 32) and sorted(labels.tolist()) == [0] * 3 + [1] * 3 + [2] * 3
    assert f"Cannot write the decoded-image cache {not_a_folder}/" in caplog.text
    assert "set data_loader.args.cache_dir to a writable folder" in caplog.text


@pytest.mark.parametrize("preset", ["cifar", "imagenet"])
def test_decoding_on_the_device_matches_pil(tmp_path, preset):
    root = write_images(tmp_path / "images", {"train": ".jpg", "val": ".jpg"})
    png = root / "val" / "b" / "1.png"  # one PNG among the JPEGs: PIL decodes it in the workers
    Image.open(png.with_suffix(".jpg")).save(png)
    png.with_suffix(".jpg").unlink()
    args = {"batch_size": 4, "seed": 0, "preset": preset, "image_size": 32}
    standard = ImageFolderDataLoader(str(root), **args)
    data = ImageFolderDataLoader(str(root), decode="device", **args)
    samples = data.dataset("val").samples
    position = [path for path, _ in samples].index(str(png))
    encoded = EncodedImages(samples, load_image_tensor)
    assert encoded[position][0].dim() == 3 and encoded[0][0].dim() == 1
    expected, expected_labels = all_batches(standard.val_loader())
    images, labels = all_batches(data.val_loader())
    assert torch.equal(labels, expected_labels)
    assert torch.equal(images[position], expected[position])
    # JPEG decoders may differ by a level or two: within 3 / 255 of the pixel range.
    torch.testing.assert_close(images, expected, atol=3 / 255 / 0.22, rtol=0)


def test_decoded_training_batches_replay_from_a_resume_point(tmp_path):
    root = write_images(tmp_path / "images", {"train": ".jpg"})
    data = ImageFolderDataLoader(
        str(root), batch_size=2, seed=0, preset="imagenet", image_size=24, decode="device",
        random_erasing=0.5, num_workers=1,
    )  # fmt: skip
    loader = data.train_loader()
    torch.manual_seed(5)  # the engine seeds the global RNG per (seed, epoch, rank)
    loader.sampler.set_epoch(1)
    whole, state = [], None
    for number, batch in enumerate(loader):
        whole.append(batch)
        if number == 1:  # two batches done: what a checkpoint saved now holds
            state = torch.get_rng_state()
    assert [images.shape for images, _ in whole] == [(2, 3, 24, 24)] * 4 + [(1, 3, 24, 24)]
    torch.manual_seed(6)
    loader.sampler.set_epoch(1, start=2 * 2)
    tail = iter(loader)
    torch.set_rng_state(state)  # restored at the resume point, before the first batch
    for (images, labels), (expected_images, expected_labels) in zip(tail, whole[2:], strict=True):
        assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)


def test_a_damaged_jpeg_is_named(tmp_path):
    root = write_images(tmp_path / "images", {"train": ".jpg"})
    damaged = root / "train" / "c" / "2.jpg"
    damaged.write_bytes(damaged.read_bytes()[:3] + b"\x07" * 200)
    data = ImageFolderDataLoader(str(root), batch_size=16, seed=0, decode="device")
    with pytest.raises(DataError) as error:
        list(data.train_loader())
    message = str(error.value)
    assert message.startswith(f"{damaged}: unreadable image (") and "\n" not in message


def test_erase_randomly_erases_one_rectangle_per_image_with_its_probability():
    images = torch.ones(200, 3, 16, 16)
    erase_randomly(images, 0.5)
    erased = (images == 0).flatten(1).any(1)
    assert 0.35 < erased.float().mean() < 0.65
    for image in images[erased]:
        rows, columns = torch.nonzero(image[0] == 0, as_tuple=True)
        area = (rows.max() - rows.min() + 1) * (columns.max() - columns.min() + 1)
        assert area == len(rows) and torch.equal(image[0] == 0, image[2] == 0)  # one rectangle
    untouched = torch.ones(4, 3, 16, 16)
    assert torch.equal(erase_randomly(untouched, 0.0), torch.ones(4, 3, 16, 16))


# --- on a GPU (gpu_check.sh runs these) ------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_on_a_gpu_batches_equal_the_cpus_and_make_no_host_device_sync():
    data = synthetic(pipeline="device", device="cuda", num_train=200)
    on_cpu = synthetic(pipeline="device", num_train=200)
    torch.testing.assert_close(
        all_batches(data.eval_loader("test"))[0].cpu(), all_batches(on_cpu.eval_loader("test"))[0]
    )
    loader = data.train_loader()
    loader.sampler.set_epoch(1)
    batches = iter(loader)
    images, labels = next(batches)  # the pass's indices are copied to the GPU here, once
    assert images.is_cuda and labels.is_cuda and images.shape == (8, 3, 32, 32)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert len(list(batches)) == len(loader) - 1
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [str(warning.message) for warning in caught if "synchroniz" in str(warning.message)]
    assert not syncs, syncs


@pytest.mark.gpu
@needs_cuda
def test_on_a_gpu_jpegs_decode_close_to_pil(tmp_path):
    root = write_images(tmp_path / "images", {"train": ".jpg", "val": ".jpg"})
    args = {"batch_size": 4, "seed": 0, "preset": "imagenet", "image_size": 32}
    expected, expected_labels = all_batches(ImageFolderDataLoader(str(root), **args).val_loader())
    data = ImageFolderDataLoader(str(root), decode="device", device="cuda", **args)
    images, labels = all_batches(data.val_loader())
    assert images.is_cuda and torch.equal(labels.cpu(), expected_labels)
    # nvJPEG and libjpeg-turbo may round differently: within 3 / 255 of the pixel range.
    torch.testing.assert_close(images.cpu(), expected, atol=3 / 255 / 0.22, rtol=0)
    train_images, _ = all_batches(data.train_loader())
    assert train_images.is_cuda and train_images.shape == (9, 3, 32, 32)


# --- end to end: train.py stopped inside an epoch resumes bit-exact ---------------------------


class StopAt(Trainer):
    """Asks to stop (as SIGTERM would) once the optimizer step stop_at_step has been taken."""

    def __init__(self, *args, stop_at_step: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stop_at_step = stop_at_step

    def training_step(self, batch):
        if self.global_step + 1 == self.stop_at_step:
            self.stop.signum = signal.SIGTERM
        return super().training_step(batch)


def final_model(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoint-epoch2.pth", weights_only=True)


@pytest.mark.parametrize("path", ["pipeline", "decode"])
def test_a_run_stopped_mid_epoch_resumes_bit_exact(tmp_path, monkeypatch, path):
    monkeypatch.setattr(trainer_module, "StopAt", StopAt, raising=False)
    monkeypatch.setattr(trainer_module, "__all__", [*trainer_module.__all__, "StopAt"])
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    if path == "pipeline":  # 256 training samples: 8 steps per epoch
        config["data_loader"]["args"]["pipeline"] = "device"
    else:  # 30 training images in batches of 4: 8 steps per epoch
        suffixes = {"train": ".jpg", "val": ".jpg"}
        root = write_images(tmp_path / "images", suffixes, size=32, count=10)
        args = {"data_dir": str(root), "preset": "cifar", "decode": "device", "batch_size": 4}
        config["data_loader"] = {"type": "ImageFolderDataLoader", "args": args}
        config["arch"]["args"]["num_classes"] = 3
    config["arch"]["args"]["dropout"] = 0.2
    config["trainer"].update(deterministic=True, type="StopAt")
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(config))
    # TensorBoard on: its image grid reads the loader's .dataset.
    assert train.main(["-c", str(config_path), "--run-id", "straight"]) == 0
    run_dir = tmp_path / "saved" / "models" / "Demo_CifarCNN"
    assert any((tmp_path / "saved" / "log" / "Demo_CifarCNN" / "straight").glob("events.*"))
    stop = ["--set", "trainer.tensorboard=false", "--set", "trainer.args.stop_at_step=10"]
    assert (
        train.main(["-c", str(config_path), "--run-id", "stopped", *stop]) == 128 + signal.SIGTERM
    )
    (saved,) = (run_dir / "stopped").glob("checkpoint-epoch2-batch*.pth")
    assert train.main(["-r", str(saved), "--set", "trainer.args.stop_at_step=0"]) == 0
    straight, resumed = final_model(run_dir / "straight"), final_model(run_dir / "stopped")
    for key, value in straight["model"].items():
        assert torch.equal(value, resumed["model"][key]), key
    assert resumed["metrics"]["train/loss"] == straight["metrics"]["train/loss"]


def test_the_loader_benchmark_runs(capsys):
    path = ROOT / "benchmarks" / "input_pipeline.py"
    spec = importlib.util.spec_from_file_location("input_pipeline", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    args = ["--quick", "--device", "cpu", "--num-workers", "1", "--num-images", "128"]
    benchmark.main([*args, "--batch-size", "32", "--jpeg-images", "8"])
    lines = capsys.readouterr().out.splitlines()
    for path_name in ("CIFAR-size, pipeline device", "224 px JPEG, decode device"):
        (line,) = [line for line in lines if path_name in line]
        assert float(line.split()[-3]) > 0  # samples/s

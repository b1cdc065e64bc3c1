"""Image folders through the device pipelines: pipeline "device"'s decoded-image cache, and
decode "device" (JPEGs decoded on the training device, the preset's transforms there), against
the PIL path; and both end to end, a run stopped inside an epoch resuming bit-exact. Here the
device is the CPU: the same code runs on a GPU (the gpu-marked test)."""

import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import NUM_EXAMPLES, ROOT, shrink
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import ExifTags, Image, ImageOps
from test_device_pipeline import all_batches
from torchvision.transforms import v2

import data_loader.device_decode
import data_loader.image_cache
import train
from base.base_data_loader import DataError
from base.base_trainer import BaseTrainer
from build import build_trainer
from data_loader.data_loaders import ImageFolderDataLoader
from data_loader.device_decode import EncodedImages, erase_randomly
from data_loader.image_files import load_image_tensor
from parse_config import ConfigParser
from utils import seed_everything
from utils.data.sampler import alternating_flips
from utils.distributed.process_group import ProcessInfo


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


@settings(max_examples=10, deadline=None)
@given(
    change=st.sampled_from(["replace", "rename file", "add", "remove", "rename class", "size"]),
    which=st.integers(0, 5),
    keep_mtime=st.booleans(),
)
@example(change="replace", which=0, keep_mtime=True)  # the case size and mtime alone missed
def test_the_cache_never_returns_the_images_of_an_older_folder(change, which, keep_mtime):
    """Whatever changed in the folder since the cache was written (a file replaced in place by
    one of the same size with its modification time put back, as `cp -p` or `rsync -t` do; a
    file added, removed or renamed; a class folder renamed; another size), what the device
    pipeline reads is what decoding the folder now gives."""
    with tempfile.TemporaryDirectory() as folder:
        root = write_images(Path(folder), {"train": ".png"}, size=8, count=2)
        path = sorted((root / "train").rglob("*.png"))[which]
        pixels = np.asarray(Image.open(path).convert("RGB"))
        # Uncompressed, a PNG's size depends on its width and height alone.
        Image.fromarray(pixels).save(path, compress_level=0)
        stat = path.stat()
        args = {"batch_size": 4, "seed": 0, "preset": "cifar", "pipeline": "device"}
        ImageFolderDataLoader(str(root), **args).uint8_split("train", 8)  # writes the cache
        size = 8
        if change == "replace":  # same name, same size, other pixels
            Image.fromarray(255 - pixels).save(path, compress_level=0)
            assert path.stat().st_size == stat.st_size
            if keep_mtime:
                os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        elif change == "rename file":
            path.rename(path.with_name("renamed.png"))
        elif change == "add":
            Image.new("RGB", (8, 8), (9, 9, 9)).save(path.with_name("added.png"))
        elif change == "remove":
            path.unlink()
        elif change == "rename class":
            (root / "train" / "c").rename(root / "train" / "d")
        else:
            size = 4
        fresh = data_loader.image_cache.decode_split(
            ImageFolderDataLoader(str(root), batch_size=4, seed=0).dataset("train"), size
        )
        images, labels = ImageFolderDataLoader(str(root), **args).uint8_split("train", size)
        assert torch.equal(images, fresh[0]) and torch.equal(labels, fresh[1])


@pytest.mark.parametrize("library", ["PIL", "torch", "torchvision"])
def test_a_cache_written_under_another_decoder_release_is_not_reused(
    tmp_path, monkeypatch, library
):
    """A new PIL, torch or torchvision may decode or resize to other pixels: the cache must then
    be the decode the DataLoader path makes now, not the one an older release made."""
    if library == "PIL":
        import PIL as module
    elif library == "torch":
        module = torch
    else:
        import torchvision as module
    root = write_images(tmp_path / "images", {"train": ".png"}, size=8, count=1)
    dataset = ImageFolderDataLoader(str(root), batch_size=4, seed=0).dataset("train")
    before = data_loader.image_cache.cache_path(dataset, 8, tmp_path)
    monkeypatch.setattr(module, "__version__", "99.0.0")
    newer = data_loader.image_cache.cache_path(dataset, 8, tmp_path)
    assert newer != before
    # A build of the same release for another accelerator decodes alike: the cache is shared.
    monkeypatch.setattr(module, "__version__", "99.0.0+cu999")
    assert data_loader.image_cache.cache_path(dataset, 8, tmp_path) == newer


BUILD_CACHE = """
import sys, torch
from data_loader.data_loaders import ImageFolderDataLoader
args = {"batch_size": 4, "seed": 0, "preset": "cifar", "pipeline": "device"}
torch.save(ImageFolderDataLoader(sys.argv[1], **args).uint8_split("train", 32), sys.argv[2])
"""


def test_two_processes_building_the_cache_at_once_read_the_same_images(tmp_path):
    """Two runs (or two nodes' first ranks) that find no cache decode at once: each writes its own
    temporary file and renames it, so neither reads a torn file and what stays is whole."""
    root = write_images(tmp_path / "images", {"train": ".png"}, count=20)
    outputs = [tmp_path / f"{number}.pt" for number in range(2)]
    processes = [
        subprocess.Popen([sys.executable, "-c", BUILD_CACHE, str(root), str(output)], cwd=ROOT)
        for output in outputs
    ]
    assert [process.wait(timeout=120) for process in processes] == [0, 0]
    fresh = data_loader.image_cache.decode_split(
        ImageFolderDataLoader(str(root), batch_size=4, seed=0).dataset("train"), 32
    )
    (cache,) = (root / ".cache").iterdir()  # one file, no temporary left
    kept = data_loader.image_cache.load_cached(cache)
    for images, labels in [*(torch.load(path) for path in outputs), kept]:
        assert torch.equal(images, fresh[0]) and torch.equal(labels, fresh[1])


def test_a_damaged_cache_file_is_decoded_again(tmp_path, caplog):
    root = write_images(tmp_path / "images", {"train": ".png"}, size=8, count=2)
    args = {"batch_size": 4, "seed": 0, "preset": "cifar", "pipeline": "device"}
    images, labels = ImageFolderDataLoader(str(root), **args).uint8_split("train", 8)
    (cache,) = (root / ".cache").iterdir()
    whole = cache.read_bytes()
    cache.write_bytes(whole[: len(whole) // 2])  # a copy cut short, a full disk
    with caplog.at_level("WARNING", logger="data"):
        again = ImageFolderDataLoader(str(root), **args).uint8_split("train", 8)
    assert torch.equal(again[0], images) and torch.equal(again[1], labels)
    assert f"Decoded-image cache {cache} unreadable (" in caplog.text
    assert len(caplog.records) == 1 and "\n" not in caplog.records[0].getMessage()
    assert cache.read_bytes() == whole  # replaced by a whole one


def test_a_cache_write_cut_short_leaves_no_temporary_behind(tmp_path):
    """A run killed while saving the cache leaves write_atomic's hidden temporary (as large as
    the cache): the next write of that folder's cache removes it, but not one being written."""
    root = write_images(tmp_path / "images", {"train": ".png"}, size=8, count=1)
    args = {"batch_size": 4, "seed": 0, "preset": "cifar", "pipeline": "device"}
    ImageFolderDataLoader(str(root), **args).uint8_split("train", 8)
    (cache,) = (root / ".cache").iterdir()
    abandoned = cache.with_name(f".{cache.name}.{'0' * 16}.tmp")
    in_progress = cache.with_name(f".{cache.name}.{'1' * 16}.tmp")
    for left in (abandoned, in_progress):
        left.write_bytes(b"partial")
    os.utime(abandoned, (0, 0))
    (root / "train" / "a" / "0.png").touch()  # a new fingerprint: the cache is written again
    ImageFolderDataLoader(str(root), **args).uint8_split("train", 8)
    assert not abandoned.exists() and in_progress.exists()


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


def global_random_states() -> tuple:
    """python's, numpy's and torch's global generators, comparable with ==."""
    return random.getstate(), repr(np.random.get_state()), torch.get_rng_state().tolist()


@pytest.mark.parametrize("num_workers", [0, 1])
def test_decoding_into_the_cache_draws_no_randomness(tmp_path, num_workers):
    """A run that finds the cache and one that decodes leave the global generators alike:
    iterating a DataLoader without a generator of its own draws its workers' seed from torch's."""
    root = write_images(tmp_path / "images", {"train": ".png", "val": ".png"})
    args = {"batch_size": 4, "seed": 0, "preset": "cifar", "pipeline": "device"}
    for _ in ("decodes", "reads the cache"):
        torch.manual_seed(0)
        before = global_random_states()
        ImageFolderDataLoader(str(root), num_workers=num_workers, **args).prepare_data()
        assert global_random_states() == before


def image_folder_trainer(root: Path, tmp_path: Path) -> BaseTrainer:
    """configs/cifar10_cnn.json shrunk, on the image folder `root` through pipeline "device"."""
    config = shrink(json.loads((ROOT / "configs/cifar10_cnn.json").read_text()), tmp_path / "saved")
    config["data_loader"] = {
        "type": "ImageFolderDataLoader",
        "args": {"data_dir": str(root), "preset": "cifar", "pipeline": "device", "batch_size": 4},
    }
    parsed = ConfigParser(config, source="test.json")
    seed_everything(parsed["seed"])  # as train.py does before it builds
    return build_trainer(parsed, ProcessInfo(), torch.device("cpu"), logging.getLogger("t"))


DRAWS = {  # what a prepare_data of a user's might draw from, e.g. for a random split
    "python": lambda: random.random(),
    "numpy": lambda: np.random.rand(),
    "torch": lambda: torch.rand(3),
    "torch_generator": lambda: torch.randperm(5, generator=torch.Generator()),  # its own: no-op
}


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_the_initial_weights_are_a_function_of_the_seed_alone(tmp_path, num_examples):
    """Whether the decoded-image cache was there (and, under torchrun, whether this rank
    prepared the data: one per node does), and whatever randomness a data loader's
    prepare_data draws, the model starts from the same weights and the generators where the seed
    put them."""
    root = write_images(tmp_path / "images", {"train": ".png", "val": ".png"})

    def built() -> tuple[dict, tuple]:
        trainer = image_folder_trainer(root, tmp_path)
        return trainer.model.state_dict(), global_random_states()

    def assert_same(found: tuple[dict, tuple], expected: tuple[dict, tuple]) -> None:
        assert found[0].keys() == expected[0].keys()
        assert all(torch.equal(found[0][key], expected[0][key]) for key in found[0])
        assert found[1] == expected[1]

    decoded = built()  # this build fills the cache, the next ones read it
    assert_same(built(), decoded)
    prepare = ImageFolderDataLoader.prepare_data

    @settings(max_examples=num_examples, deadline=None)
    @given(st.lists(st.sampled_from(sorted(DRAWS)), max_size=6))
    def check(draws: list[str]) -> None:
        def prepare_drawing(self: ImageFolderDataLoader) -> None:
            for name in draws:
                DRAWS[name]()
            prepare(self)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ImageFolderDataLoader, "prepare_data", prepare_drawing)
            assert_same(built(), decoded)

    check()


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


def save_photo(path: Path, pixels: np.ndarray, orientation: int) -> None:
    """`pixels` (H, W, 3) as a JPEG tagged with EXIF `orientation`, as a phone saves a photo
    (stored as the sensor saw it, with a tag saying how to turn it)."""
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = orientation
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, exif=exif)


def as_viewed(path: Path) -> torch.Tensor:
    """The file as an image viewer shows it, (3, H, W) uint8: PIL's exif_transpose."""
    with Image.open(path) as image:
        return v2.functional.pil_to_tensor(ImageOps.exif_transpose(image).convert("RGB"))


@settings(max_examples=24, deadline=None)
@given(
    orientation=st.integers(1, 8),
    height=st.integers(8, 40),
    width=st.integers(8, 40),
    seed=st.integers(0, 2**16),
)
def test_every_decoder_shows_a_tagged_jpeg_as_an_image_viewer_does(
    orientation, height, width, seed
):
    # A phone's portrait photo is stored sideways with EXIF Orientation 6: read as stored, a
    # model trains and predicts on images turned 90 degrees from what the user looks at.
    coarse = np.random.default_rng(seed).integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    smooth = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    with tempfile.TemporaryDirectory() as folder:
        root, path = Path(folder), Path(folder) / "train" / "a" / "photo.jpg"
        save_photo(path, np.asarray(smooth), orientation)
        expected = as_viewed(path)
        # PIL, in the DataLoader's workers and in predict.py.
        assert torch.equal(load_image_tensor(str(path)), expected)
        # pipeline "device": the split decoded once, resized, into the cache.
        args = {"batch_size": 1, "seed": 0, "preset": "cifar"}
        cached = ImageFolderDataLoader(str(root), pipeline="device", **args)
        images, _ = cached.uint8_split("train", 16)
        assert torch.equal(images[0], v2.Resize((16, 16), antialias=True)(expected))
        # decode "device": a worker reads the bytes and the tag, the device decodes and turns.
        batches = ImageFolderDataLoader(str(root), decode="device", **args).train_loader()
        data, _, _, tag = EncodedImages([(str(path), 0)], load_image_tensor)[0]
        (decoded,) = batches.decode([data], [tag], [str(path)])
        # torchvision's libjpeg and PIL's may differ by a level or two.
        torch.testing.assert_close(decoded, expected, atol=3, rtol=0)


def mirrored(data: ImageFolderDataLoader, epoch: int) -> set[int]:
    """The training indices whose images `data`'s loader yields mirrored in `epoch`: closer to
    the plain image flipped than to it (crop_padding 0: no other change of place)."""
    loader = data.train_loader()
    loader.sampler.set_epoch(epoch)
    order = [int(index) for index in loader.sampler]
    images = all_batches(loader)[0].cpu()  # from a GPU too (test_gpu_paths.py)
    plain = data.view("train", augment=False)
    found = set()
    for index, image in zip(order, images, strict=True):
        reference = plain[index][0]
        if (image - reference.flip(-1)).abs().mean() < (image - reference).abs().mean():
            found.add(index)
    return found


def alternating(root: Path, decode: str, seed: int, device: str = "cpu") -> ImageFolderDataLoader:
    args = {"batch_size": 4, "seed": seed, "preset": "cifar", "image_size": 36, "device": device}
    return ImageFolderDataLoader(
        str(root), decode=decode, flip="alternating", crop_padding=0, **args
    )


def test_alternating_flips_mirror_the_same_images_when_decoding_on_the_device(tmp_path):
    """The reported case (issue 31, item 15): over two passes the PIL path mirrors every image
    once; decode "device" mirrored none."""
    root = write_images(tmp_path / "images", {"train": ".jpg"})
    counts = {}
    for decode in ("pil", "device"):
        data = alternating(root, decode, seed=0)
        passes = [mirrored(data, epoch) for epoch in (1, 2)]
        counts[decode] = sum(len(indices) for indices in passes)
        assert passes[0].isdisjoint(passes[1])
    assert counts == {"pil": 9, "device": 9}


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_both_decoders_flip_the_same_images_in_the_same_epochs(tmp_path, num_examples):
    root = write_images(tmp_path / "images", {"train": ".jpg"})

    @settings(max_examples=num_examples)
    @given(st.integers(0, 2**31), st.integers(0, 50))
    def check(seed: int, epoch: int) -> None:
        pil, device = (alternating(root, decode, seed) for decode in ("pil", "device"))
        bits = alternating_flips(9, seed)
        expected = {index for index in range(9) if bits[index] == (epoch % 2 == 0)}
        assert mirrored(pil, epoch) == mirrored(device, epoch) == expected

    check()


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
    loader.sampler.set_epoch(1, skip=2 * 2)
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


def test_the_device_running_out_of_memory_while_decoding_is_not_hidden(tmp_path, monkeypatch):
    """decode_jpeg's OutOfMemoryError is a RuntimeError, which the decoder took for a file it
    cannot read: every image of every batch was then decoded again by PIL, the run many times
    slower and the error never shown. It now reaches the user as it is."""
    root = write_images(tmp_path / "images", {"train": ".jpg"})
    loader = ImageFolderDataLoader(str(root), batch_size=4, seed=0, decode="device").train_loader()
    decoded_by_pil = []

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def by_pil(path: str) -> torch.Tensor:
        decoded_by_pil.append(path)
        return load_image_tensor(path)

    monkeypatch.setattr(data_loader.device_decode, "decode_jpeg", no_memory)
    monkeypatch.setattr(loader, "pil_decode", by_pil)
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"):
        next(iter(loader))
    assert decoded_by_pil == []


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_jpeg_over_pils_pixel_limit_is_named_as_the_pil_path_names_it(tmp_path, num_workers):
    """A JPEG whose header claims more pixels than PIL's limit (a decompression bomb): the PIL
    path refuses it in one line naming the file; decode "device" raised PIL's
    DecompressionBombError from the worker, a traceback without the file's name."""
    root = write_images(tmp_path / "images", {"train": ".jpg"}, count=1)
    bomb = root / "train" / "b" / "0.jpg"
    data = bytearray(bomb.read_bytes())
    frame = data.find(b"\xff\xc0") + 5  # the baseline frame header's height and width
    data[frame : frame + 4] = (20000).to_bytes(2, "big") * 2  # 400 M pixels
    bomb.write_bytes(data)
    messages = []
    for decode in ("pil", "device"):
        args = {"batch_size": 4, "seed": 0, "num_workers": num_workers, "decode": decode}
        with pytest.raises(DataError) as error:
            list(ImageFolderDataLoader(str(root), **args).train_loader())
        messages.append(str(error.value))
    assert messages[0] == messages[1]
    assert messages[1].startswith(f"{bomb}: unreadable image (DecompressionBombError: ")
    assert "\n" not in messages[1]


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


# --- on a GPU (gpu_check.sh runs it) --------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_on_a_gpu_jpegs_decode_close_to_pil(tmp_path):
    root = write_images(tmp_path / "images", {"train": ".jpg", "val": ".jpg"})
    # A phone photo's tag: nvJPEG ignores it; the loader turns the image as PIL does.
    tagged = root / "val" / "a" / "0.jpg"
    save_photo(tagged, np.asarray(Image.open(tagged)), orientation=6)
    args = {"batch_size": 4, "seed": 0, "preset": "imagenet", "image_size": 32}
    expected, expected_labels = all_batches(ImageFolderDataLoader(str(root), **args).val_loader())
    data = ImageFolderDataLoader(str(root), decode="device", device="cuda", **args)
    images, labels = all_batches(data.val_loader())
    assert images.is_cuda and torch.equal(labels.cpu(), expected_labels)
    # nvJPEG and libjpeg-turbo upsample the colour planes differently: single pixels at colour
    # edges differ by up to ~20 / 255 (0.35 normalised, seen on an H200), the image as a whole
    # by little. In normalised units (pixel / 255 / std, std about 0.22).
    difference = (images.cpu() - expected).abs()
    assert difference.mean() < 3 / 255 / 0.22, float(difference.mean())
    assert difference.max() < 40 / 255 / 0.22, float(difference.max())
    train_images, _ = all_batches(data.train_loader())
    assert train_images.is_cuda and train_images.shape == (9, 3, 32, 32)


# --- end to end: train.py stopped inside an epoch resumes bit-exact ---------------------------


def final_model(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoint-epoch2.pth", weights_only=True)


@pytest.mark.parametrize("path", ["pipeline", "decode"])
def test_a_run_stopped_mid_epoch_resumes_bit_exact(tmp_path, stop_at, path):
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
    (saved,) = (run_dir / "stopped").glob("checkpoint-epoch2-step*.pth")
    assert train.main(["-r", str(saved), "--set", "trainer.args.stop_at_step=0"]) == 0
    straight, resumed = final_model(run_dir / "straight"), final_model(run_dir / "stopped")
    for key, value in straight["model"].items():
        assert torch.equal(value, resumed["model"][key]), key
    assert resumed["metrics"]["train/loss"] == straight["metrics"]["train/loss"]

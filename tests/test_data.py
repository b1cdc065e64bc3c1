"""Data: synthetic images, transforms, seeded splits, samplers and the three folder formats."""

import json
import os
import random
import re
import tempfile
import time
import unittest
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from cifar_archive import CLASSES as CIFAR_CLASSES
from cifar_archive import NUM_PER_BATCH, NUM_TEST, PLANTED
from conftest import NO_SAMPLE, NUM_EXAMPLES, SAMPLE_DIR, checkpoint_dirs, run_main
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from base import EpochSampler
from base.base_data_loader import DataError
from data_loader.data_loaders import (
    Cifar10DataLoader,
    ImageFolderDataLoader,
    SyntheticDataLoader,
)
from data_loader.image_files import load_image
from data_loader.noisy_shapes import NoisyShapesDataLoader
from data_loader.synthetic import CLASS_NAMES, SyntheticShapes, generate
from data_loader.transforms import CIFAR10_MEAN, CIFAR10_STD, PRESETS, cifar_transform
from utils import ConfigValueError, derive_seed
from utils.data import splits as data_splits
from utils.data.sampler import alternating_flips

MEAN = torch.tensor(CIFAR10_MEAN).view(3, 1, 1)
STD = torch.tensor(CIFAR10_STD).view(3, 1, 1)


def unnormalise(image: torch.Tensor) -> torch.Tensor:
    """(3, H, W) normalised tensor -> pixel values in [0, 255]."""
    return (image * STD + MEAN) * 255


def all_batches(loader: torch.utils.data.DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = zip(*loader, strict=True)
    return torch.cat(images), torch.cat(labels)


# The loaders' input pipelines: per-sample transforms in a DataLoader (the default), or the split
# held on the training device (here the CPU) and augmented there a batch at a time.
PIPELINES = pytest.mark.parametrize("pipeline", ["dataloader", "device"])


# --- synthetic data --------------------------------------------------------------------------


def test_generate_is_deterministic_in_the_seed():
    images, labels = generate(40, seed=3)
    same_images, same_labels = generate(40, seed=3)
    other_images, other_labels = generate(40, seed=4)
    assert np.array_equal(images, same_images)
    assert np.array_equal(labels, same_labels)
    assert not np.array_equal(images, other_images)
    assert not np.array_equal(labels, other_labels)
    # A list seed (what SyntheticDataLoader passes per split) works the same way.
    assert np.array_equal(generate(5, seed=[0, 1])[0], generate(5, seed=[0, 1])[0])
    assert not np.array_equal(generate(5, seed=[0, 0])[0], generate(5, seed=[0, 1])[0])


def test_generate_shapes_and_labels():
    images, labels = generate(500, seed=0)
    assert images.shape == (500, 32, 32, 3)
    assert images.dtype == np.uint8
    assert labels.shape == (500,)
    assert labels.min() >= 0 and labels.max() <= 9
    assert set(labels.tolist()) == set(range(10))
    # Pictures, not blank frames.
    assert images.reshape(500, -1).std(axis=1).min() > 5


def test_synthetic_shapes_dataset():
    dataset = SyntheticShapes(12, seed=7)
    images, labels = generate(12, seed=7)
    assert len(dataset) == 12
    image, label = dataset[5]
    assert np.array_equal(image, images[5])
    assert label == labels[5] and isinstance(label, int)
    assert SyntheticShapes.classes == CLASS_NAMES and len(CLASS_NAMES) == 10


# --- transforms ------------------------------------------------------------------------------


@pytest.mark.parametrize("as_pil", [False, True], ids=["numpy", "pil"])
def test_cifar_transform_maps_hwc_uint8_to_chw_float(as_pil):
    image = np.random.default_rng(0).integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
    # Distinct values at places where a transposed or channel-swapped layout would differ.
    image[3, 17, 2] = 251
    image[17, 3, 2] = 4
    image[3, 17, 0] = 9
    source = Image.fromarray(image) if as_pil else image
    output = cifar_transform(augment=False)(source)
    assert output.shape == (3, 32, 32)
    assert output.dtype == torch.float32
    pixels = unnormalise(output)
    assert pixels[2, 3, 17].item() == pytest.approx(251, abs=1e-3)
    assert pixels[2, 17, 3].item() == pytest.approx(4, abs=1e-3)
    assert pixels[0, 3, 17].item() == pytest.approx(9, abs=1e-3)
    expected = torch.from_numpy(image).permute(2, 0, 1).float()  # (3, H, W)
    torch.testing.assert_close(pixels, expected, atol=1e-3, rtol=0)


def test_cifar_transform_augments_only_when_asked():
    image = np.random.default_rng(1).integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
    plain = cifar_transform(augment=False)
    augment = cifar_transform(augment=True)
    assert torch.equal(plain(image), plain(image))
    outputs = [augment(image) for _ in range(8)]
    assert all(output.shape == (3, 32, 32) for output in outputs)
    assert any(not torch.equal(output, plain(image)) for output in outputs)


# --- SyntheticDataLoader: splits and loaders -------------------------------------------------


def synthetic(**kwargs) -> SyntheticDataLoader:
    args = {"batch_size": 16, "seed": 0, "validation_split": 0.2, "num_train": 200, "num_test": 50}
    return SyntheticDataLoader(**{**args, **kwargs})


@pytest.mark.parametrize("loader", [SyntheticDataLoader, NoisyShapesDataLoader])
@pytest.mark.parametrize("data_seed", [1.5, -1, float("nan"), True, "0"])
def test_a_data_seed_that_is_no_seed_is_refused_in_one_line(loader, data_seed):
    # numpy's SeedSequence took it to a traceback at the first split (a float, a negative).
    args = {"batch_size": 16, "seed": 0, "num_train": 20, "num_test": 5, "data_seed": data_seed}
    with pytest.raises(ConfigValueError, match=r"^data_seed must be an integer >= 0, got "):
        loader(**args)
    dataset = loader(**{**args, "data_seed": 2**40}).dataset("train")  # a large seed is one
    assert len(dataset) == 20 and dataset[19] is not None


def test_split_indices_are_a_seeded_partition():
    train, val = synthetic().split_indices()
    assert len(train) == 160 and len(val) == 40
    assert not set(train.tolist()) & set(val.tolist())
    assert sorted([*train.tolist(), *val.tolist()]) == list(range(200))

    same_train, same_val = synthetic().split_indices()
    assert np.array_equal(train, same_train) and np.array_equal(val, same_val)
    _, other_val = synthetic(seed=1).split_indices()
    assert not np.array_equal(val, other_val)


@pytest.mark.parametrize(("validation_split", "num_val"), [(0.1, 20), (0.25, 50), (30, 30), (1, 1)])
def test_validation_split_as_fraction_or_count(validation_split, num_val):
    data = synthetic(validation_split=validation_split)
    train, val = data.split_indices()
    assert len(val) == num_val and len(train) == 200 - num_val
    assert len(data.val_loader().sampler) == num_val
    assert len(data.train_loader().sampler) == 200 - num_val


@pytest.mark.parametrize("validation_split", [200, 250, 0.999])
def test_validation_split_leaving_no_training_data(validation_split):
    with pytest.raises(DataError, match="leaves no training samples out of 200"):
        synthetic(validation_split=validation_split).split_indices()


@settings(max_examples=50, deadline=None)
@given(
    num_train=st.integers(1, 60),
    share=st.floats(0.001, 0.999) | st.integers(1, 70),
    seed=st.integers(0, 2**31),
)
def test_a_validation_split_is_a_partition_of_two_non_empty_shares_or_refused(
    num_train, share, seed
):
    data = synthetic(num_train=num_train, validation_split=share, seed=seed)
    try:
        train, val = data.split_indices()
    except DataError as error:  # too few samples for the share asked: the message says which
        assert "validation_split" in str(error)
        return
    assert len(train) and len(val) and not set(train.tolist()) & set(val.tolist())
    assert sorted([*train.tolist(), *val.tolist()]) == list(range(num_train))


def test_a_validation_fraction_of_no_sample_says_to_raise_it():
    with pytest.raises(DataError, match=r"validation_split: 0.002 of 200 .* raise it"):
        synthetic(validation_split=0.002).split_indices()


@PIPELINES
def test_validation_loader_is_not_augmented(pipeline):
    data = synthetic(pipeline=pipeline)
    torch.manual_seed(1)
    first_images, first_labels = all_batches(data.val_loader())
    torch.manual_seed(2)
    second_images, second_labels = all_batches(data.val_loader())
    assert torch.equal(first_images, second_images)
    assert torch.equal(first_labels, second_labels)
    # They are the training split's images at the validation indices, un-augmented.
    _, val_indices = data.split_indices()
    train_split = data.dataset("train")
    plain = cifar_transform(augment=False)
    for position in (0, 17, 39):
        image, label = train_split[int(val_indices[position])]
        assert torch.equal(first_images[position], plain(image))
        assert first_labels[position].item() == label


@PIPELINES
def test_training_loader_augments_differently_each_epoch(pipeline):
    # A fixed order, so batch 0 holds the same samples each epoch.
    data = synthetic(pipeline=pipeline, shuffle=False)
    loader = data.train_loader()

    def first_batch(epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        # The trainer seeds the global RNGs from (seed, epoch, rank) before each epoch.
        torch.manual_seed(derive_seed(0, epoch, 0))
        loader.sampler.set_epoch(epoch)
        return next(iter(loader))

    epoch_1_images, epoch_1_labels = first_batch(1)
    epoch_2_images, epoch_2_labels = first_batch(2)
    assert torch.equal(epoch_1_labels, epoch_2_labels)
    assert not torch.equal(epoch_1_images, epoch_2_images)
    # ...and an epoch replays exactly (what resume relies on).
    assert torch.equal(first_batch(1)[0], epoch_1_images)


@PIPELINES
def test_eval_loader_splits(pipeline):
    data = synthetic(pipeline=pipeline)
    val_images, val_labels = all_batches(data.val_loader())
    eval_images, eval_labels = all_batches(data.eval_loader("val"))
    assert torch.equal(val_images, eval_images) and torch.equal(val_labels, eval_labels)

    test_loader = data.eval_loader("test")
    test_images, test_labels = all_batches(test_loader)
    assert len(test_loader.sampler) == 50 and len(test_labels) == 50
    assert test_images.shape == (50, 3, 32, 32)

    with pytest.raises(DataError, match="no 'holdout' split"):
        data.eval_loader("holdout")
    # Without validation_split there is no "val": SyntheticDataLoader has no val split of its own.
    no_val = synthetic(validation_split=0.0)
    assert no_val.val_loader() is None
    with pytest.raises(DataError, match="no 'val' split"):
        no_val.eval_loader("val")


def test_synthetic_train_and_test_splits_differ():
    data = synthetic()
    train_image, _ = data.dataset("train")[0]
    test_image, _ = data.dataset("test")[0]
    assert not np.array_equal(train_image, test_image)
    assert data.class_names() == CLASS_NAMES


# --- EpochSampler ----------------------------------------------------------------------------


@pytest.fixture
def restore_global_rngs():
    """Tests that reseed numpy's and Python's global RNGs put them back afterwards."""
    numpy_state, python_state = np.random.get_state(), random.getstate()
    yield
    np.random.set_state(numpy_state)
    random.setstate(python_state)


def order(sampler: EpochSampler, epoch: int, pass_index: int = 0) -> list[int]:
    sampler.set_epoch(epoch, pass_index)
    return list(sampler)


@pytest.mark.usefixtures("restore_global_rngs")
def test_epoch_sampler_order_is_a_function_of_seed_epoch_and_pass():
    indices = list(range(100, 150))
    sampler = EpochSampler(indices, shuffle=True, seed=5)
    base = order(sampler, 3)
    assert sorted(base) == indices and base != indices

    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        np.random.seed(global_seed)
        random.seed(global_seed)
        assert order(sampler, 3) == base
        assert order(EpochSampler(indices, shuffle=True, seed=5), 3) == base
    assert order(sampler, 4) != base
    assert order(sampler, 3, pass_index=1) != base
    assert order(EpochSampler(indices, shuffle=True, seed=6), 3) != base
    assert order(EpochSampler(indices, shuffle=False, seed=5), 3) == indices


@pytest.mark.parametrize("shuffle", [False, True])
def test_epoch_sampler_shares_without_padding(shuffle):
    indices = list(range(11))
    shares = [
        order(EpochSampler(indices, shuffle=shuffle, seed=0, num_replicas=2, rank=rank), 1)
        for rank in (0, 1)
    ]
    assert [len(share) for share in shares] == [6, 5]
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == indices
    for rank, share in enumerate(shares):
        sampler = EpochSampler(indices, shuffle=shuffle, seed=0, num_replicas=2, rank=rank)
        assert len(sampler) == len(share)


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_evaluation_shares_hold_every_sample_once_for_any_size_and_world(num_examples):
    """The evaluation sampler (no padding) deals any number of samples, fewer than the ranks
    too, to any world size: every sample on exactly one rank, shares within one of each other,
    each rank's length what it yields. A metric summed over ranks then counts each once."""

    @settings(max_examples=num_examples)
    @given(st.integers(0, 300), st.integers(1, 8), st.booleans(), st.integers(0, 2**31))
    def check(num_samples: int, world: int, shuffle: bool, seed: int) -> None:
        indices = list(range(num_samples))
        samplers = [
            EpochSampler(indices, shuffle=shuffle, seed=seed, num_replicas=world, rank=rank)
            for rank in range(world)
        ]
        shares = [order(sampler, 1) for sampler in samplers]
        assert sorted(index for share in shares for index in share) == indices
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
        assert [len(sampler) for sampler in samplers] == [len(share) for share in shares]

    check()


@pytest.mark.parametrize("shuffle", [False, True])
def test_epoch_sampler_shares_with_padding(shuffle):
    indices = list(range(11))
    samplers = [
        EpochSampler(indices, shuffle=shuffle, seed=0, num_replicas=2, rank=rank, pad=True)
        for rank in (0, 1)
    ]
    shares = [order(sampler, 1) for sampler in samplers]
    assert [len(share) for share in shares] == [6, 6]
    assert [len(sampler) for sampler in samplers] == [6, 6]
    assert set(shares[0]) | set(shares[1]) == set(indices)
    assert len(set(shares[0]) & set(shares[1])) == 1  # only the one padding sample repeats


samplers = st.fixed_dictionaries(
    {
        "num_indices": st.integers(0, 40),
        "draws": st.sampled_from(["in order", "permutation", "replacement", "weighted"]),
        "num_samples": st.one_of(st.none(), st.integers(1, 90)),
        "num_replicas": st.integers(1, 3),
        "rank": st.integers(0, 2),
        "pad": st.booleans(),
        "flips": st.booleans(),
        "epoch": st.integers(0, 5),
        "pass_index": st.integers(0, 2),
        "skip": st.integers(0, 50),
    }
)


def make_sampler(case: dict) -> EpochSampler:
    """The EpochSampler a `samplers` case describes, at its epoch, pass and skip."""
    shuffle = case["draws"] != "in order"
    indices = list(range(100, 100 + case["num_indices"]))
    sampler = EpochSampler(
        indices,
        shuffle=shuffle,
        seed=7,
        num_replicas=case["num_replicas"],
        rank=case["rank"] % case["num_replicas"],
        pad=case["pad"],
        replacement=case["draws"] == "replacement",
        num_samples=case["num_samples"] if shuffle else None,
        weights=[1 + index % 3 for index in indices] if case["draws"] == "weighted" else None,
    )
    if case["flips"]:
        sampler.flips = alternating_flips(200, seed=7)
    sampler.set_epoch(case["epoch"], case["pass_index"], skip=case["skip"])
    return sampler


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_pass_indices_are_the_indices_iteration_yields(num_examples):
    """pass_indices, the array pipeline "device" copies to the device, is the order iteration
    gives (issue 31, item 18), for every kind of draw, share, padding and resume skip."""

    @settings(max_examples=num_examples)
    @given(samplers)
    def check(case: dict) -> None:
        sampler = make_sampler(case)
        indices = sampler.pass_indices()
        assert indices.dtype == np.int64
        assert indices.tolist() == [int(index) for index in sampler]

    check()


def flipped_images(data: SyntheticDataLoader, epoch: int) -> list[int]:
    """The training indices `data`'s loader yields mirrored in `epoch` (crop_padding 0)."""
    loader = data.train_loader()
    loader.sampler.set_epoch(epoch)
    images, _ = all_batches(loader)
    plain = data.view("train", augment=False)
    order = loader.sampler.pass_indices().tolist()
    return [
        index
        for index, image in zip(order, images, strict=True)
        if torch.equal(image, plain[index][0].flip(-1))
    ]


@pytest.mark.usefixtures("restore_global_rngs")
@pytest.mark.parametrize("num_workers", [0, 1])
@PIPELINES
def test_a_sequential_training_sampler_augments_as_a_shuffled_one(pipeline, num_workers):
    # A sequential training order yielded plain indices, as evaluation does: the DataLoader path
    # then left out alternating flips altogether, and drew the rest from the global RNG.
    args = {"sampler": "sequential", "flip": "alternating", "crop_padding": 0}
    if pipeline == "dataloader":
        args["num_workers"] = num_workers
    data = synthetic(pipeline=pipeline, validation_split=0, num_train=40, **args)
    flips = data.train_sampler().flips
    for epoch in (1, 2):
        expected = np.flatnonzero(flips ^ (epoch % 2 == 1)).tolist()
        assert flipped_images(data, epoch) == expected


# --- Cifar10DataLoader on a generated archive in torchvision's format ------------------------


def cifar(data_dir: Path, **kwargs) -> Cifar10DataLoader:
    args = {"batch_size": 16, "seed": 0, "download": False, **kwargs}
    return Cifar10DataLoader(str(data_dir), **args)


@PIPELINES
def test_cifar10_reads_torchvision_format(cifar_dir, pipeline):
    data = cifar(cifar_dir, pipeline=pipeline)
    assert len(data.dataset("train")) == 5 * NUM_PER_BATCH
    assert data.class_names() == CIFAR_CLASSES
    assert len(data.train_loader().sampler) == 100
    assert data.val_loader() is None

    loader = data.eval_loader("train")
    index, channel, row, column = PLANTED
    image, label = loader.dataset[index]
    assert label == index % 10
    pixels = unnormalise(image)
    assert pixels[channel, row, column].item() == pytest.approx(251, abs=1e-3)
    # Everything else in that image is black: the pixel landed nowhere else.
    brightest = torch.nonzero(pixels > 1).tolist()
    assert brightest == [[channel, row, column]]

    test_images, test_labels = all_batches(data.eval_loader("test"))
    assert test_images.shape == (NUM_TEST, 3, 32, 32)
    assert test_labels.tolist() == [offset % 10 for offset in range(NUM_TEST)]


@PIPELINES
def test_cifar10_validation_split(cifar_dir, pipeline):
    data = cifar(cifar_dir, validation_split=0.25, pipeline=pipeline)
    train, val = data.split_indices()
    assert len(train) == 75 and len(val) == 25
    assert len(data.train_loader().sampler) == 75
    _, val_labels = all_batches(data.val_loader())
    assert val_labels.tolist() == [int(index) % 10 for index in val]


def test_an_image_size_of_one_is_refused_in_one_line(cifar_dir):
    # It was torch's internal assertion (num_channels == unpacked_output.size(0)) at the first
    # batch: the antialiased uint8 resize of a CHW array image to 1 x 1.
    with pytest.raises(
        ConfigValueError, match=r"^image_size must be an integer >= 2 or null, got 1$"
    ):
        cifar(cifar_dir, image_size=1)


@settings(max_examples=30, deadline=None)
@given(
    preset=st.sampled_from(["cifar", "imagenet"]),
    augment=st.booleans(),
    size=st.integers(2, 8),
    shape=st.tuples(st.integers(1, 40), st.integers(1, 40)),
    as_pil=st.booleans(),
)
def test_every_accepted_size_transforms_any_image_to_that_size(
    preset, augment, size, shape, as_pil
):
    # The arrays of the CIFAR loaders and the PIL images of ImageFolder, square or not.
    pixels = np.random.default_rng(0).integers(0, 256, size=(*shape, 3), dtype=np.uint8)
    image = Image.fromarray(pixels) if as_pil else pixels
    transform = PRESETS[preset](augment, image_size=size)
    assert transform(image).shape == (3, size, size)


def test_cifar10_missing_folder_says_where_and_what_to_run(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError) as error:
        cifar(missing).train_loader()
    message = str(error.value)
    assert str(missing / "cifar-10-batches-py") in message
    assert "configs/demo.json" in message


# --- ImageFolderDataLoader -------------------------------------------------------------------


def make_image_folder(root: Path, layout: dict[str, list[str]], *, num_images: int = 3) -> Path:
    """root/<split>/<class>/<n>.png, 40x40 RGB noise."""
    rng = np.random.default_rng(0)
    for split, classes in layout.items():
        (root / split).mkdir(parents=True)
        for name in classes:
            (root / split / name).mkdir()
            for index in range(num_images):
                pixels = rng.integers(0, 256, size=(40, 40, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{index}.png")
    return root


CLASSES = ["cat", "dog", "emu"]


def image_folder(root: Path, **kwargs) -> ImageFolderDataLoader:
    return ImageFolderDataLoader(str(root), **{"batch_size": 4, "seed": 0, **kwargs})


# The DataLoader path; the split on the device (cifar); JPEGs decoded on the device.
FOLDER_PATHS = {
    "dataloader": {},
    "pipeline": {"pipeline": "device"},
    "decode": {"decode": "device"},
}


@pytest.mark.parametrize(
    ("preset", "image_size", "size", "path"),
    [
        ("cifar", None, 32, "dataloader"),
        ("imagenet", 64, 64, "dataloader"),
        ("cifar", None, 32, "pipeline"),
        ("imagenet", 64, 64, "decode"),
    ],
)
def test_image_folder_presets_give_the_configured_size(tmp_path, preset, image_size, size, path):
    root = make_image_folder(tmp_path / "images", {"train": CLASSES, "val": CLASSES})
    data = image_folder(root, preset=preset, image_size=image_size, **FOLDER_PATHS[path])
    assert data.class_names() == CLASSES
    train_images, train_labels = all_batches(data.train_loader())
    assert train_images.shape == (9, 3, size, size)
    assert sorted(train_labels.tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # Evaluation must give the same size as training: the model's in_shape depends on it.
    val_images, _ = all_batches(data.val_loader())
    assert val_images.shape == (9, 3, size, size)


@pytest.fixture(scope="module")
def square_folder(tmp_path_factory) -> Path:
    # Square images: torch's antialiased uint8 resize fails on them at a 1 x 1 output.
    return make_image_folder(tmp_path_factory.mktemp("images"), {"train": CLASSES, "val": CLASSES})


@settings(max_examples=30, deadline=None)
@given(
    preset=st.sampled_from(["cifar", "imagenet"]),
    pipeline=st.sampled_from(["dataloader", "device"]),
    image_size=st.integers(1, 8),
    eval_image_size=st.none() | st.integers(1, 8),
)
def test_every_image_size_gives_its_batches_or_is_refused_in_one_line(
    square_folder, preset, pipeline, image_size, eval_image_size
):
    # A size is refused when the loader is built, never at the first batch with torch's traceback.
    sizes = {"image_size": image_size, "eval_image_size": eval_image_size}
    if preset == "imagenet":
        pipeline = "dataloader"  # the device pipeline is cifar's only
    if min(size for size in sizes.values() if size is not None) < 2:
        with pytest.raises(ConfigValueError, match=r"^\w+ must be an integer >= 2 or null, got 1$"):
            image_folder(square_folder, preset=preset, pipeline=pipeline, **sizes)
        return
    data = image_folder(square_folder, preset=preset, pipeline=pipeline, **sizes)
    train_images, _ = all_batches(data.train_loader())
    val_images, _ = all_batches(data.val_loader())
    assert train_images.shape[-2:] == (image_size, image_size)
    crop = eval_image_size or image_size
    assert val_images.shape[-2:] == (crop, crop)


@pytest.mark.parametrize("path", FOLDER_PATHS)
def test_image_folder_test_split_falls_back_to_val(tmp_path, path):
    root = make_image_folder(tmp_path / "images", {"train": CLASSES, "val": CLASSES})
    preset = "cifar" if path == "pipeline" else "imagenet"
    data = image_folder(root, preset=preset, image_size=32, **FOLDER_PATHS[path])
    assert data.splits == ("train", "val", "test")
    val_images, val_labels = all_batches(data.eval_loader("val"))
    test_images, test_labels = all_batches(data.eval_loader("test"))
    assert torch.equal(val_images, test_images) and torch.equal(val_labels, test_labels)


def test_image_folder_uses_test_folder_when_present(tmp_path):
    root = make_image_folder(tmp_path / "images", {"train": CLASSES, "val": CLASSES})
    make_image_folder(root, {"test": CLASSES}, num_images=2)
    data = image_folder(root, preset="imagenet", image_size=32)
    assert data.splits == ("train", "val", "test")
    assert len(data.eval_loader("val").sampler) == 9
    assert len(data.eval_loader("test").sampler) == 6


def test_image_folder_validation_split_takes_precedence_over_val(tmp_path):
    root = make_image_folder(tmp_path / "images", {"train": CLASSES, "val": CLASSES}, num_images=4)
    data = image_folder(root, preset="imagenet", image_size=32, validation_split=3)
    assert len(data.train_loader().sampler) == 9
    assert len(data.val_loader().sampler) == 3
    assert len(data.eval_loader("test").sampler) == 12  # val/ still serves as the test split


def test_image_folder_missing_train_folder(tmp_path):
    root = make_image_folder(tmp_path / "images", {"val": CLASSES})
    with pytest.raises(DataError, match=re.escape(str(root / "train"))):
        image_folder(root)


def test_image_folder_without_class_folders(tmp_path):
    (tmp_path / "images" / "train").mkdir(parents=True)
    data = image_folder(tmp_path / "images")
    with pytest.raises(DataError, match=re.escape(str(tmp_path / "images" / "train"))):
        data.train_loader()


def test_image_folder_with_empty_class_folders(tmp_path):
    root = make_image_folder(tmp_path / "images", {"train": CLASSES}, num_images=0)
    with pytest.raises(DataError, match="train"):
        image_folder(root).train_loader()


@pytest.mark.parametrize("path", FOLDER_PATHS)
def test_hidden_files_and_folders_are_not_data(tmp_path, path):
    # What macOS and Jupyter leave behind: ._<name> beside each copied file (AppleDouble, not an
    # image), .DS_Store, and a .ipynb_checkpoints folder, which ImageFolder took for a class.
    root = make_image_folder(tmp_path / "images", {"train": CLASSES, "val": CLASSES})
    for split in ("train", "val"):
        (root / split / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
        (root / split / ".ipynb_checkpoints").mkdir()
        (root / split / ".ipynb_checkpoints" / "notes-checkpoint.ipynb").write_text("{}")
        for name in CLASSES:
            (root / split / name / "._0.png").write_bytes(b"\0\5\x16\7" + bytes(60))
    preset = "cifar" if path == "pipeline" else "imagenet"
    data = image_folder(root, preset=preset, image_size=32, **FOLDER_PATHS[path])
    assert data.class_names() == CLASSES
    _, train_labels = all_batches(data.train_loader())
    _, val_labels = all_batches(data.val_loader())
    assert (
        sorted(train_labels.tolist()) == sorted(val_labels.tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    )


# Extensions a folder of photos may hold: read (JPEGs under other names too), and not read.
READ = [".jpg", ".JPEG", ".jfif", ".JFIF", ".jpe", ".png", ".webp"]
UNREAD = [".heic", ".HEIC", ".heif", ".avif", ".gif"]


@settings(max_examples=20, deadline=None)
@given(
    read=st.lists(st.sampled_from(READ), min_size=1, max_size=6),
    unread=st.lists(st.sampled_from(UNREAD), max_size=4),
    path=st.sampled_from(sorted(FOLDER_PATHS)),
)
def test_every_image_file_is_a_sample_or_counted_in_a_warning(read, unread, path):
    # A folder of .jfif files gave no sample and .heic ones were dropped without a word: fewer
    # samples than the user has. Files that are not images, and hidden ones, are not counted.
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "train" / "cat").mkdir(parents=True)
        pixels = np.random.default_rng(0).integers(0, 256, size=(40, 40, 3), dtype=np.uint8)
        for index, suffix in enumerate(read):
            Image.fromarray(pixels).save(root / "train" / "cat" / f"{index}{suffix}")
        for index, suffix in enumerate([*unread, ".txt"]):
            (root / "train" / "cat" / f"other{index}{suffix}").write_bytes(b"not read")
        (root / "train" / "cat" / "._photo.heic").write_bytes(b"\0\5\x16\7")
        preset = "cifar" if path == "pipeline" else "imagenet"
        data = image_folder(root, preset=preset, image_size=32, **FOLDER_PATHS[path])
        case = unittest.TestCase()
        if unread:
            with case.assertLogs("data", "WARNING") as captured:
                images, _ = all_batches(data.eval_loader("train"))
            (message,) = captured.output
            assert f"{root / 'train'}: left out {len(unread)} image files" in message
        else:
            with case.assertNoLogs("data", "WARNING"):
                images, _ = all_batches(data.eval_loader("train"))
        assert len(images) == len(read)


def test_a_class_folder_of_photos_in_an_unread_format_is_named_with_them(tmp_path, caplog):
    root = make_image_folder(tmp_path / "images", {"train": CLASSES})
    for image in (root / "train" / "dog").iterdir():
        image.rename(image.with_suffix(".heic"))
    with pytest.raises(DataError, match="no valid file for the classes dog"):
        image_folder(root).train_loader()
    assert "left out 3 image files of a format not read (3 .heic)" in caplog.text


def test_image_folder_val_classes_must_match_train(tmp_path):
    root = make_image_folder(tmp_path / "images", {"train": CLASSES, "val": ["cat", "dog"]})
    data = image_folder(root)
    with pytest.raises(DataError, match="differ") as error:
        data.val_loader()
    assert str(root / "val") in str(error.value)
    assert "an empty folder for a class without images" in str(error.value)


@pytest.mark.parametrize("split", ["val", "test"])
def test_an_evaluation_folder_may_hold_no_image_of_a_class(tmp_path, split):
    # A test set without a sample of some class: its folder left empty keeps the labels right.
    root = make_image_folder(
        tmp_path / "images", {"train": CLASSES, "val": CLASSES, split: CLASSES}
    )
    for image in (root / split / "dog").iterdir():
        image.unlink()
    data = image_folder(root, preset="imagenet", image_size=32)
    _, labels = all_batches(data.eval_loader(split))
    assert sorted(set(labels.tolist())) == [0, 2]
    assert data.dataset(split).classes == CLASSES


def grey_as(pixels: np.ndarray, mode: str) -> Image.Image:
    """The 8-bit grey `pixels` as an image of `mode`: 16-bit ones hold each value x 257."""
    if mode.startswith("I"):
        return Image.fromarray(pixels.astype(np.uint16) * 257).convert(mode)
    return Image.fromarray(pixels).convert(mode)


@pytest.mark.parametrize(
    ("mode", "suffix"),
    [("L", ".png"), ("RGBA", ".png"), ("I;16", ".png"), ("I;16", ".tif"), ("I", ".tif")],
)
def test_an_image_reaches_the_model_the_same_whatever_its_bit_depth(tmp_path, mode, suffix):
    # A 16-bit image converted as PIL does it, clipped to 255, reaches the model all white.
    pixels = np.random.default_rng(0).integers(0, 256, size=(32, 32), dtype=np.uint8)
    for name, image in (("a", grey_as(pixels, "RGB")), ("b", grey_as(pixels, mode))):
        (tmp_path / "images" / "train" / name).mkdir(parents=True)
        image.save(tmp_path / "images" / "train" / name / f"0{suffix}")
    data = image_folder(tmp_path / "images", preset="cifar", validation_split=0)
    images, labels = all_batches(data.eval_loader("train"))
    assert labels.tolist() == [0, 1]
    torch.testing.assert_close(images[1], images[0], atol=1e-6, rtol=0)


def test_a_floating_point_image_is_refused_naming_it(tmp_path):
    # Pixels of unknown range (here 0 to 1): PIL's conversion clips them to 0 or 1 of 255, black.
    root = make_image_folder(tmp_path / "images", {"train": CLASSES})
    path = root / "train" / "dog" / "float.tif"
    Image.fromarray(np.random.default_rng(0).random((32, 32), dtype=np.float32)).save(path)
    data = image_folder(root, preset="cifar", sampler="sequential")
    with pytest.raises(DataError, match=f"^{re.escape(str(path))}: .*floating-point"):
        all_batches(data.train_loader())


@settings(max_examples=24, deadline=None)
@given(low=st.integers(-(2**31), 2**17), span=st.integers(0, 2**17))
def test_a_32_bit_integer_image_is_scaled_from_16_bits_or_refused_naming_it(low, span):
    # Mode "I" (a 32-bit TIFF) past 65535 was clipped to 16 bits: its bright pixels all white.
    pixels = np.linspace(low, min(low + span, 2**31 - 1), 64).astype(np.int32).reshape(8, 8)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "grey.tif"
        Image.fromarray(pixels).save(path)
        if pixels.min() < 0 or pixels.max() > 65535:
            with pytest.raises(DataError) as error:
                load_image(str(path))
            assert re.match(f"{re.escape(str(path))}: .*32-bit integer pixels", str(error.value))
            assert "\n" not in str(error.value)
        else:
            expected = ((pixels.astype(np.int64) + 128) // 257).astype(np.uint8)
            assert np.array_equal(np.asarray(load_image(str(path)))[..., 0], expected)


def test_a_32_bit_image_past_16_bits_is_refused_naming_it(tmp_path):
    root = make_image_folder(tmp_path / "images", {"train": CLASSES})
    path = root / "train" / "dog" / "deep.tif"
    Image.fromarray(np.full((32, 32), 70000, dtype=np.int32)).save(path)
    data = image_folder(root, preset="cifar", sampler="sequential")
    with pytest.raises(DataError, match=f"^{re.escape(str(path))}: .*from 70000 to 70000, past"):
        all_batches(data.train_loader())


@pytest.mark.parametrize(
    ("sizes", "crop"), [({"image_size": 64}, 64), ({"image_size": 32, "eval_image_size": 64}, 64)]
)
def test_an_evaluation_resize_smaller_than_its_crop_is_refused(tmp_path, sizes, crop):
    # CenterCrop would pad every evaluation image with black borders to reach the crop.
    root = make_image_folder(tmp_path / "images", {"train": CLASSES, "val": CLASSES})
    with pytest.raises(ValueError, match=f"eval_resize_size: 48 is smaller than .* {crop}"):
        image_folder(root, preset="imagenet", eval_resize_size=48, **sizes)
    data = image_folder(root, preset="imagenet", eval_resize_size=crop, **sizes)
    images, _ = all_batches(data.val_loader())
    assert images.shape[-2:] == (crop, crop)


@pytest.mark.parametrize("option", [{"crop_padding": 8}, {"padding_mode": "reflect"}], ids=str)
def test_the_cifar_crops_options_are_refused_with_the_imagenet_preset(tmp_path, option):
    # RandomResizedCrop has no padding: the option would change nothing, silently.
    root = make_image_folder(tmp_path / "images", {"train": CLASSES})
    with pytest.raises(ValueError, match=f'{next(iter(option))}.*only for preset "cifar"'):
        image_folder(root, preset="imagenet", **option)
    assert image_folder(root, preset="cifar", **option).augmentation.items() >= option.items()


def test_image_folder_unknown_preset(tmp_path):
    root = make_image_folder(tmp_path / "images", {"train": CLASSES})
    with pytest.raises(ValueError, match="unknown preset 'mnist'"):
        image_folder(root, preset="mnist")


# --- real images -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not SAMPLE_DIR.is_dir(), reason=NO_SAMPLE)
def test_train_on_real_cifar_images_beats_chance(make_config, tmp_path):
    epochs = 8
    config_path = make_config(
        "configs/demo.json",
        **{
            "data_loader": {
                "type": "ImageFolderDataLoader",
                "args": {
                    "data_dir": str(SAMPLE_DIR),
                    "preset": "cifar",
                    "batch_size": 64,
                    "shuffle": True,
                    "validation_split": 0.0,  # use val/: 500 held-out images
                    "num_workers": 0,
                    "pin_memory": False,
                },
            },
            "arch.args.widths": [16, 32, 64],
            "arch.args.convs_per_block": 1,
            "optimizer.args.lr": 0.003,
            "lr_scheduler.args.T_max": epochs,
            "trainer.epochs": epochs,
            "trainer.tensorboard": False,
        },
    )
    assert json.loads(config_path.read_text())["lr_scheduler"]["type"] == "CosineAnnealingLR"
    start = time.perf_counter()  # in-process (run_main): the training's time, no interpreter's
    result = run_main("train.py", "-c", str(config_path))
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2000 training samples, 500 validation samples, 10 classes" in result.stdout

    logged = re.findall(rf"epoch {epochs}/{epochs} .*val/accuracy ([0-9.]+)", result.stdout)
    assert len(logged) == 1, result.stdout[-3000:]
    (run_dir,) = checkpoint_dirs(tmp_path / "saved")
    checkpoint = torch.load(run_dir / f"checkpoint-epoch{epochs}.pth", weights_only=True)
    accuracy = checkpoint["metrics"]["val/accuracy"]
    assert float(logged[0]) == pytest.approx(accuracy, abs=5e-4)  # logged with 4 digits
    print(
        f"real CIFAR-10 sample: val/accuracy {accuracy:.3f} after {epochs} epochs, {seconds:.1f} s"
    )
    assert accuracy > 0.30  # chance is 0.10


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_an_image_folders_sample_ids_are_its_file_names_under_the_root(num_examples):
    """sample_ids, which the data fingerprint of every run digests, cuts the root off each path
    as os.path.relpath does, for any way of writing the root: a checkpoint written before the
    cut (issue 37) still resumes on the same files."""
    name = st.text("abcXYZ09_-. ", min_size=1, max_size=8).filter(
        lambda text: text not in (".", "..")
    )
    roots = st.sampled_from(["data", "data/", "./data", "data//train", "/abs/data/", "../up/data"])

    @settings(max_examples=num_examples)
    @given(roots, st.lists(st.tuples(name, name, st.integers(0, 9)), min_size=1, max_size=5))
    def check(root: str, files: list[tuple[str, str, int]]) -> None:
        samples = [(os.path.join(root, folder, file), label) for folder, file, label in files]
        dataset = SimpleNamespace(root=root, samples=samples)
        expected = [f"{os.path.relpath(path, root)}\0{label}" for path, label in samples]
        assert data_splits.sample_ids(dataset) == expected

    check()

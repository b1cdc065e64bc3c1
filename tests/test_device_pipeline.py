"""pipeline "device" against the DataLoader path it replaces: a split held on the training
device and augmented there a batch at a time (CIFAR-size data). Here the device is the CPU: the
same code runs on a GPU (the gpu-marked test). Image folders: tests/test_image_folder_pipelines.py."""

import importlib.util
import warnings

import pytest
import torch
from conftest import ROOT
from hypothesis import example, given, settings
from hypothesis import strategies as st

from data_loader.data_loaders import ImageFolderDataLoader, SyntheticDataLoader
from data_loader.device_pipeline import DeviceBatches, Normalise, crop_and_flip
from data_loader.transforms import CIFAR10_MEAN, CIFAR10_STD
from utils import ConfigValueError
from utils.data.batches import epoch_batches
from utils.data.sampler import EpochSampler, alternating_flips
from utils.util import DataError

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


def assert_same_batches(expected_loader, loader) -> None:
    """`loader` yields `expected_loader`'s batches bit for bit, as many as both their len()s."""
    expected, found = list(expected_loader), list(loader)
    assert len(found) == len(expected) == len(loader) == len(expected_loader)
    for (images, labels), (expected_images, expected_labels) in zip(found, expected, strict=True):
        assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)


@settings(max_examples=25, deadline=None)
@given(
    num_train=st.integers(11, 50),  # 10 of them for validation
    num_test=st.integers(1, 20),
    batch_size=st.integers(1, 9),
    num_replicas=st.integers(1, 3),
    drop_last=st.booleans(),
    epoch=st.integers(1, 5),
)
def test_every_sample_once_in_the_dataloaders_batches_for_any_sizes(
    num_train, num_test, batch_size, num_replicas, drop_last, epoch
):
    """For any split size, batch size and number of ranks: evaluation batches equal the
    DataLoader path's bit for bit (so do its metrics), each sample once over the ranks; the
    training pass (unaugmented) has the DataLoader's samples, batches and drop_last rule."""
    args = {"batch_size": batch_size, "num_train": num_train, "num_test": num_test}
    seen = []
    for rank in range(num_replicas):
        shared = {**args, "num_replicas": num_replicas, "rank": rank, "num_workers": 0}
        standard, device = synthetic(**shared), synthetic(pipeline="device", **shared)
        for split in ("val", "test"):
            loaders = standard.eval_loader(split), device.eval_loader(split)
            assert_same_batches(*loaders)
            if split == "test":
                seen += list(loaders[1].sampler)
        samplers = standard.train_sampler(), device.train_sampler()
        drop = drop_last and len(samplers[0]) >= batch_size  # as train_loader decides
        loaders = [
            data.loader("train", sampler, augment=False, drop_last=drop)
            for data, sampler in zip((standard, device), samplers, strict=True)
        ]
        for sampler in samplers:
            sampler.set_epoch(epoch)
        assert_same_batches(*loaders)
    assert sorted(seen) == list(range(num_test))


@settings(max_examples=25, deadline=None)
@given(
    num_images=st.integers(1, 40),
    batch_size=st.integers(1, 16),
    padding=st.integers(0, 8),
    padding_mode=st.sampled_from(["constant", "reflect"]),
    flip=st.sampled_from(["random", "alternating", "none"]),
    seed=st.integers(0, 2**16),
)
def test_labels_stay_with_their_images_through_the_augmentation(
    num_images, batch_size, padding, padding_mode, flip, seed
):
    """Images whose every pixel is their label's code: after crop, padding and flip the centre
    pixel (inside the image for any offset) still gives each image's label."""
    labels = torch.arange(num_images) % 10
    codes = (labels * 20 + 15).to(torch.uint8)  # 15, 35, ..., 195
    images = codes.view(-1, 1, 1, 1).expand(-1, 3, 20, 20).contiguous()
    sampler = EpochSampler(range(num_images), shuffle=True, seed=seed)
    if flip == "alternating":
        sampler.flips = alternating_flips(num_images, seed)
    batches = DeviceBatches(
        images,
        labels,
        sampler,
        dataset=None,
        batch_size=batch_size,
        drop_last=False,
        augment=True,
        normalise=Normalise(CIFAR10_MEAN, CIFAR10_STD, torch.device("cpu")),
        seed=seed,
        padding=padding,
        padding_mode=padding_mode,
        flip=flip,
    )
    sampler.set_epoch(3)
    output, output_labels = all_batches(batches)
    assert sorted(output_labels.tolist()) == sorted(labels.tolist())
    assert torch.equal(
        to_pixels(output)[:, :, 10, 10], codes[output_labels].view(-1, 1).expand(-1, 3)
    )


def test_a_pass_is_ordered_without_a_python_object_per_sample(monkeypatch):
    """The pass's order comes from the sampler's index array (issue 31, item 18): iterating the
    sampler makes a SeededIndex per sample, 70-250 ms for a 45,000-sample pass."""
    data = synthetic(pipeline="device")
    loader = data.train_loader()
    loader.sampler.set_epoch(2)
    order = [int(index) for index in loader.sampler]
    expected = all_batches(loader)

    def no_iteration(sampler):
        raise AssertionError("the sampler was iterated")

    monkeypatch.setattr(EpochSampler, "__iter__", no_iteration)
    images, labels = all_batches(loader)
    assert torch.equal(images, expected[0]) and torch.equal(labels, expected[1])
    assert labels.tolist() == data.labels("train")[order].tolist()


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
    loader.sampler.set_epoch(3, 1, skip=3 * 8)  # one process: 3 batches of its share
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


@settings(max_examples=25, deadline=None)
@given(
    num_train=st.integers(12, 50),
    batch_size=st.integers(1, 9),
    num_replicas=st.integers(1, 3),
    drop_last=st.booleans(),
    flip=st.sampled_from(["random", "alternating", "none"]),
    data=st.data(),
)
def test_a_resume_at_any_batch_continues_the_uninterrupted_epoch(
    num_train, batch_size, num_replicas, drop_last, flip, data
):
    """On every rank, the batches after a resume at any batch of a len_epoch spanning passes
    are the uninterrupted epoch's, augmentation included."""
    rank = data.draw(st.integers(0, num_replicas - 1))
    loader = synthetic(
        pipeline="device", num_train=num_train, batch_size=batch_size, flip=flip,
        num_replicas=num_replicas, rank=rank,
    ).train_loader(drop_last=drop_last)  # fmt: skip
    len_epoch = data.draw(st.integers(1, 3 * len(loader)))
    first_batch = data.draw(st.integers(0, len_epoch - 1))
    whole = list(epoch_batches(loader, 2, 0, len_epoch, lambda: None))
    resumed = list(epoch_batches(loader, 2, first_batch, len_epoch, lambda: None))
    assert len(resumed) == len_epoch - first_batch
    for (images, labels), (expected_images, expected_labels) in zip(
        resumed, whole[first_batch:], strict=True
    ):
        assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)


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
    with pytest.raises(ConfigValueError, match="cache_dir must be a folder path or null, got 3"):
        ImageFolderDataLoader(str(tmp_path), batch_size=4, seed=0, cache_dir=3)


@settings(max_examples=20, deadline=None)
@given(image_size=st.integers(2, 20), crop_padding=st.integers(0, 15))
@example(image_size=4, crop_padding=4)  # the reported case: a traceback at the first batch
def test_reflect_padding_wider_than_the_image_is_refused_up_front(image_size, crop_padding):
    """Reflect padding mirrors pixels of the image: torch's pad needs fewer than its side. A
    padding that the first batch would fail on is a one-line ConfigValueError at construction;
    any other trains on both pipelines."""
    args = {"image_size": image_size, "crop_padding": crop_padding, "padding_mode": "reflect"}
    if crop_padding >= image_size:
        with pytest.raises(ConfigValueError, match=f"crop_padding: {crop_padding} with padding_"):
            synthetic(**args)
        return
    for pipeline in ("dataloader", "device"):
        loader = synthetic(pipeline=pipeline, num_train=12, num_workers=0, **args).train_loader()
        loader.sampler.set_epoch(1)
        images, _ = next(iter(loader))
        assert images.shape == (2, 3, image_size, image_size)


class NoRoom(torch.Tensor):
    """A split that the device has no memory for: moving it raises CUDA's out-of-memory error."""

    def to(self, *args, **kwargs) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 150.00 MiB")


def test_a_split_the_device_has_no_memory_for_is_one_line(monkeypatch):
    """pipeline "device" copies the whole split to the device: one too large for it was a torch
    OutOfMemoryError traceback at the start; now a DataError saying what to change."""
    data = synthetic(pipeline="device")
    split = data.uint8_split

    def too_large(name: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = split(name, size)
        return images.as_subclass(NoRoom), labels

    monkeypatch.setattr(data, "uint8_split", too_large)
    with pytest.raises(DataError) as error:
        data.train_loader()
    message = str(error.value)
    assert message.startswith('pipeline "device": split "train" (60 images of 32 px, 0.00 GiB')
    assert 'use "pipeline": "dataloader"' in message and "\n" not in message


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


# --- on a GPU (gpu_check.sh runs it) --------------------------------------------------------

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

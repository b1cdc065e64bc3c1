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
from data_loader.device_pipeline import crop_and_flip
from data_loader.transforms import CIFAR10_MEAN, CIFAR10_STD
from utils import ConfigValueError
from utils.data.batches import epoch_batches
from utils.data.sampler import EpochSampler

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

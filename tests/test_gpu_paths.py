"""The resume-related GPU paths on a real GPU (benchmarks/gpu_check.sh runs them; skipped without
CUDA): JPEGs decoded on the GPU never overwrite memory queued work still reads, the averaged
weights, the metric sums and every shipped metric update without a host sync, and cuda:N
becomes the current device. And issue 31's GPU paths: alternating flips with decode "device",
auto_augment there without a host sync per image, trainer.tf32 with torch.compile's autotuning."""

import time
import warnings
from pathlib import Path

import pytest
import torch
from PIL import Image
from test_evaluation import CLASSIFICATION, SHIPPED
from test_image_folder_pipelines import alternating, mirrored, write_images
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from data_loader.data_loaders import ImageFolderDataLoader
from data_loader.transforms import AUTO_AUGMENT, augmentation_policy
from utils.distributed.device import use_device
from utils.evaluation.metric_sums import MetricSums, StepOutput
from utils.optim.averaging import update_average
from utils.util import set_tf32

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def syncs(call) -> list[str]:
    """The synchronizing CUDA calls `call()` makes, as torch's sync debug mode reports them."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [str(w.message) for w in caught if "synchroniz" in str(w.message)]


def test_decoding_on_the_gpu_leaves_memory_that_queued_kernels_read_alone(tmp_path: Path):
    """pytorch/vision#9606: decode_jpeg's outputs may take memory just freed on the current stream
    while kernels queued there still read it. Through the template's decoder they never do."""
    for index in range(8):
        folder = tmp_path / "images" / "train" / "a"
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (512, 512), (index * 30, 90, 200)).save(folder / f"{index}.jpg")
    data = ImageFolderDataLoader(
        str(tmp_path / "images"), preset="cifar", decode="device", batch_size=8, seed=0,
        device="cuda",
    )  # fmt: skip
    batches = data.train_loader()
    samples = data.dataset("train").samples
    encoded = [
        torch.frombuffer(bytearray(Path(p).read_bytes()), dtype=torch.uint8) for p, _ in samples
    ]
    paths = [path for path, _ in samples]
    corrupted = 0
    for _ in range(20):
        tensors = [torch.full((1 << 20,), float(i), device="cuda") for i in range(16)]
        torch.cuda.synchronize()
        torch.cuda._sleep(20_000_000)  # a long kernel: what follows waits in the queue
        sums = [tensor.sum() for tensor in tensors]  # queued reads of the tensors
        del tensors  # freed while those reads are still queued
        batches.decode(list(encoded), [1] * len(encoded), paths)
        torch.cuda.synchronize()
        corrupted += sum(int(total.item() != i * (1 << 20)) for i, total in enumerate(sums))
    assert corrupted == 0


def test_the_average_updates_without_a_host_sync():
    model = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64)).cuda()
    model(torch.randn(8, 64, device="cuda"))
    average = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.99), use_buffers=True)
    update_average(average, model, restart=True)
    assert syncs(lambda: update_average(average, model, restart=False)) == []
    print(
        "torch's AveragedModel.update_parameters:", syncs(lambda: average.update_parameters(model))
    )


def test_metric_sums_add_in_float64_without_a_host_sync():
    sums = MetricSums({"total": lambda output, target: output.sum()}, torch.device("cuda"))
    assert sums.totals.dtype == torch.float64
    output = torch.ones(32, device="cuda")
    loss = torch.ones((), device="cuda")
    assert syncs(lambda: sums.add(StepOutput(loss=loss, output=output, target=output), 1)) == []


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_metric_adds_up_without_a_host_sync(name):
    """Issue 31, item 18: F1's boolean mask and bincount waited for the GPU every step (on the
    CPU, tests/test_evaluation.py runs each metric on the meta device instead)."""
    metric = SHIPPED[name]
    if name in CLASSIFICATION:
        output = torch.randn(8, 4, 5, 5, device="cuda")
        target = torch.randint(4, (8, 5, 5), device="cuda")
    else:
        output, target = (
            torch.rand(8, 3, 5, 5, device="cuda"),
            torch.rand(8, 3, 5, 5, device="cuda"),
        )
    sums = MetricSums({name: metric}, torch.device("cuda"))
    loss = torch.ones((), device="cuda")
    step = StepOutput(loss=loss, output=output, target=target)
    sums.add(step, 1)  # the first call may set up what later ones reuse
    assert syncs(lambda: sums.add(step, 2)) == []


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_named_gpu_becomes_the_current_device():
    use_device(torch.device("cuda", 1))
    try:
        assert torch.cuda.current_device() == 1
        assert torch.empty(1, device="cuda").device.index == 1
    finally:
        torch.cuda.set_device(0)


# --- issue 31 ---------------------------------------------------------------------------------


def test_alternating_flips_on_the_gpu_mirror_what_pil_mirrors(tmp_path: Path):
    """Item 15: decode "device" on the GPU mirrors the PIL path's images in the same epochs."""
    root = write_images(tmp_path / "images", {"train": ".jpg"})
    pil, gpu = alternating(root, "pil", 0), alternating(root, "device", 0, device="cuda")
    passes = [mirrored(gpu, epoch) for epoch in (1, 2)]
    assert passes == [mirrored(pil, epoch) for epoch in (1, 2)]
    assert sum(len(indices) for indices in passes) == 9


@pytest.mark.parametrize("name", AUTO_AUGMENT)
def test_auto_augment_on_the_gpu_gives_torchvisions_images_without_a_host_sync(name: str):
    """Item 18: the device policy replays torchvision's draws on GPU images bit for bit, and
    makes no sync once each draw's map exists; torchvision's own syncs per image, printed."""
    (policy,) = augmentation_policy(name, "imagenet")
    (on_device,) = augmentation_policy(name, "imagenet", on_device=True)
    images = torch.randint(0, 256, (256, 3, 176, 176), dtype=torch.uint8, device="cuda")

    def run(transform) -> torch.Tensor:
        torch.default_generator.manual_seed(0)  # the CPU generator the policies draw from
        return torch.stack([transform(image) for image in images])

    expected = run(policy)
    assert torch.equal(run(on_device), expected)
    assert syncs(lambda: run(on_device)) == []
    for label, transform in (("torchvision", policy), ("device variant", on_device)):
        run(transform)
        torch.cuda.synchronize()
        start = time.perf_counter()
        count = len(syncs(lambda transform=transform: run(transform)))
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        per_image = f"{count / len(images):.2f} syncs, {seconds / len(images) * 1e3:.2f} ms"
        print(f"{name}, {label}: per image {per_image}")


def test_tf32_reaches_the_kernels_and_compile_autotunes_after_it():
    """Item 17: trainer.tf32 turns TF32 on and off for matrix products and cuDNN convolutions,
    and torch.compile's max-autotune (which reads get_float32_matmul_precision) compiles after."""
    a, b = torch.randn(2, 1024, 1024, device="cuda")
    images, weight = (
        torch.randn(8, 64, 32, 32, device="cuda"),
        torch.randn(64, 64, 3, 3, device="cuda"),
    )
    exact = [a.double() @ b.double(), torch.nn.functional.conv2d(images.double(), weight.double())]
    errors = {}
    for enabled in (True, False):
        set_tf32(enabled)
        outputs = [a @ b, torch.nn.functional.conv2d(images, weight)]
        errors[enabled] = [
            (out - ref).abs().max().item() for out, ref in zip(outputs, exact, strict=True)
        ]
    print("max error with TF32 on / off (matmul, conv):", errors[True], errors[False])
    assert all(on > 10 * off for on, off in zip(errors[True], errors[False], strict=True))
    set_tf32(True)
    model = nn.Linear(256, 256).cuda()
    inputs = torch.randn(64, 256, device="cuda")
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")
        torch.testing.assert_close(compiled(inputs), model(inputs), atol=1e-2, rtol=1e-2)
    finally:
        torch._dynamo.reset()

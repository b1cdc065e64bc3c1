"""The fast CIFAR-10 recipe (issue 22) and the general features it is made of, each against its
definition: alternating flips, translation with reflect padding (both pipelines), test-time
augmentation, parameter groups by kind, frozen normalisation scales, the whitening layer; and
the recipe end to end: trained, resumed bit-exact mid-epoch, tested."""

import itertools
import json
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, run_main, without_muon

import data_loader.data_loaders as data_module
import train
from data_loader.device_pipeline import crop_and_flip
from model.fast_cifar import FastCifarCNN
from utils.data.sampler import SeededIndex, alternating_flips
from utils.evaluation.tta import AverageOverViews
from utils.optim.optimizer import NORM_LAYERS, parameter_groups
from utils.util import ConfigError, DataError

PIPELINES = ["dataloader", "device"]


def cifar(data_dir: Path, **kwargs: object) -> data_module.Cifar10DataLoader:
    args = {"batch_size": 16, "seed": 0, "validation_split": 20, "download": False, **kwargs}
    return data_module.Cifar10DataLoader(str(data_dir), **args)


def epoch_images(loader: object, epoch: int) -> dict[int, torch.Tensor]:
    """{training index: the image as the loader yields it in `epoch`}."""
    loader.sampler.set_epoch(epoch)
    order = [int(index) for index in loader.sampler]
    images = torch.cat([images for images, _ in loader])
    return dict(zip(order, images, strict=True))


# --- alternating flips and reflect translation, on both pipelines --------------------------------


def test_alternating_flips_mirror_every_sample_in_every_other_epoch_on_both_pipelines(cifar_dir):
    seen = {}
    for pipeline in PIPELINES:
        data = cifar(cifar_dir, flip="alternating", crop_padding=0, pipeline=pipeline)
        loader = data.train_loader()
        seen[pipeline] = [epoch_images(loader, epoch) for epoch in (1, 2, 3)]
        plain = data.view("train", augment=False)
        bits = alternating_flips(len(data.dataset("train")), seed=0)
        for index, image in seen[pipeline][0].items():
            # Epoch 1 is odd: a sample is flipped there when its seeded coin says not to in even ones.
            flipped = plain[index][0].flip(-1)
            assert torch.equal(image, flipped if not bits[index] else plain[index][0])
            assert torch.equal(seen[pipeline][1][index], image.flip(-1))  # the other way
            assert torch.equal(seen[pipeline][2][index], image)  # and back
        assert 0 < bits[list(seen[pipeline][0])].sum() < len(seen[pipeline][0])
    # Without random crops both pipelines are deterministic: the same images, bit for bit.
    for dataloader, device in zip(seen["dataloader"], seen["device"], strict=True):
        assert all(torch.equal(dataloader[index], device[index]) for index in dataloader)


def reflect_crops(image: torch.Tensor, padding: int) -> list[torch.Tensor]:
    """Every crop of image (C, H, W) padded by mirroring at the edges (numpy's "reflect")."""
    padded = torch.from_numpy(
        np.pad(image.numpy(), [(0, 0), (padding,) * 2, (padding,) * 2], "reflect")
    )
    height, width = image.shape[-2:]
    return [
        padded[:, top : top + height, left : left + width]
        for top, left in itertools.product(range(2 * padding + 1), repeat=2)
    ]


def test_device_translation_with_reflect_padding_is_a_crop_of_the_mirrored_image():
    images = torch.randint(0, 256, (300, 3, 8, 8), dtype=torch.uint8)
    out = crop_and_flip(
        images, torch.Generator().manual_seed(0), 2, padding_mode="reflect",
        flips=torch.zeros(300, dtype=torch.bool),
    )  # fmt: skip
    offsets = set()
    for image, cropped in zip(images, out, strict=True):
        matches = [
            i for i, crop in enumerate(reflect_crops(image, 2)) if torch.equal(crop, cropped)
        ]
        assert matches, "not a crop of the mirrored image"
        offsets.add(matches[0])
    assert offsets == set(range(25))  # every offset drawn


def test_dataloader_translation_with_reflect_padding_is_a_crop_of_the_mirrored_image(cifar_dir):
    data = cifar(cifar_dir, crop_padding=2, padding_mode="reflect", flip="none")
    augmented, plain = data.view("train", augment=True), data.view("train", augment=False)
    mean = torch.tensor(data.mean).view(-1, 1, 1)
    std = torch.tensor(data.std).view(-1, 1, 1)
    offsets = set()
    for draw in range(200):
        index = draw % 80
        image = augmented[SeededIndex(index, draw)][0]
        raw = (plain[index][0] * std + mean) * 255  # the uint8 image back (to within rounding)
        seen = (image * std + mean) * 255
        distances = [float((crop - seen).abs().max()) for crop in reflect_crops(raw, 2)]
        assert min(distances) < 1e-2
        offsets.add(int(np.argmin(distances)))
    assert len(offsets) > 20


# --- test-time augmentation -----------------------------------------------------------------------


def shifted(images: torch.Tensor, shift: int) -> torch.Tensor:
    """out[..., i, j] = images[..., reflect(i + shift), reflect(j + shift)]: the content moved
    by -shift, its edges mirrored."""
    size = images.shape[-1]
    index = torch.arange(size) + shift
    index = torch.where(index < 0, -index, index)
    index = torch.where(index > size - 1, 2 * (size - 1) - index, index)
    return images[..., index, :][..., index]


def test_tta_averages_the_model_over_the_views_it_names():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(5)
    )
    images = torch.randn(6, 3, 8, 8)
    model(images)
    flips = [images, images.flip(-1)]
    views = flips + [shifted(view, shift) for view in flips for shift in (1, -1)]
    logits = torch.stack([model(view) for view in views])  # (6 views, B, 5)
    mean = AverageOverViews(model, flip=True, translate=1, average="logits")
    torch.testing.assert_close(mean(images), logits.mean(dim=0))
    probabilities = AverageOverViews(model, flip=True, translate=1, average="probabilities")
    torch.testing.assert_close(probabilities(images).exp(), logits.softmax(-1).mean(dim=0))
    only_flip = AverageOverViews(model, flip=True, translate=0, average="logits")
    torch.testing.assert_close(only_flip(images), logits[:2].mean(dim=0))
    with pytest.raises(
        DataError, match=r"need batches of images \(B, C, H, W\), got inputs of shape \(6, 10\)"
    ):
        AverageOverViews(torch.nn.Identity(), flip=True, translate=0, average="logits")(
            torch.zeros(6, 10)
        )


# --- parameter groups by kind, frozen normalisation scales ---------------------------------------


def test_param_groups_by_kind_take_exactly_the_parameters_of_that_kind():
    model = FastCifarCNN(widths=[8, 8, 8], whiten_samples=10)
    norm_biases = {id(m.bias) for m in model.modules() if isinstance(m, NORM_LAYERS)}
    rest, biases = parameter_groups(model, [{"kind": "norm_bias", "lr": 9.0}], "x.json")
    assert {id(p) for p in biases["params"]} == norm_biases and biases["lr"] == 9.0
    assert "kind" not in biases
    assert not norm_biases & {id(p) for p in rest["params"]}
    # kind and prefix together: their intersection.
    _, block = parameter_groups(model, [{"params": "features.1", "kind": "norm"}], "x.json")
    block_norms = {
        id(p)
        for m in model.features[1].modules()
        if isinstance(m, NORM_LAYERS)
        for p in m.parameters()
    }
    assert {id(p) for p in block["params"]} == block_norms
    with pytest.raises(ConfigError, match=r"param_groups\[0\].kind: 'norm' matches no trainable"):
        parameter_groups(torch.nn.Linear(2, 2), [{"kind": "norm"}], "x.json")


def recipe(tmp_path: Path, cifar_dir: Path, **trainer: object) -> Path:
    """config.json (the fast recipe), tiny: the generated archive, 5 batches of 16 per epoch."""
    config = without_muon(json.loads((ROOT / "config.json").read_text()))
    config["arch"]["args"].update(widths=[8, 16, 16], whiten_samples=40)
    config["data_loader"]["args"].update(
        data_dir=str(cifar_dir), download=False, batch_size=16, validation_split=20
    )
    config["trainer"].update(
        epochs=2, save_dir=str(tmp_path / "saved"), save_period=1, tensorboard=False, **trainer
    )
    path = tmp_path / "fast.json"
    path.write_text(json.dumps(config))
    return path


def test_a_bad_kind_is_one_line(tmp_path, cifar_dir, capsys):
    config = recipe(tmp_path, cifar_dir)
    code = train.main(["-c", str(config), "--set", 'optimizer.param_groups=[{"kind": "norms"}]'])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "param_groups[0].kind: must be one of norm, norm_weight" in err
    assert not (tmp_path / "saved").exists()


# --- the whitening layer ---------------------------------------------------------------------------


def test_whitening_is_fitted_on_training_images_only_and_decorrelates_their_patches(cifar_dir):
    data = cifar(cifar_dir)
    model = FastCifarCNN(widths=[8, 8, 8], whiten_samples=50, whiten_eps=1e-6)
    asked = []
    original = data.training_samples

    def recorded(*args: object, **kwargs: object) -> list:
        asked.append((args, kwargs))
        return original(*args, **kwargs)

    data.training_samples = recorded
    model.fit_data(data)
    assert asked == [((50,), {"transformed": True})]
    train_indices = set(data.split_indices()[0].tolist())
    chosen = original(50, transformed=True)
    plain = data.view("train", augment=False)
    assert all(any(torch.equal(image, plain[i][0]) for i in train_indices) for image, _ in chosen)
    images = torch.stack([image for image, _ in chosen])
    with torch.no_grad():
        whitened = torch.nn.functional.conv2d(images, model.whiten.weight[:12])  # (N, 12, h, w)
    values = whitened.permute(0, 2, 3, 1).reshape(-1, 12).double()
    covariance = torch.cov(values.T)
    torch.testing.assert_close(covariance, torch.eye(12, dtype=torch.float64), atol=1e-3, rtol=0)
    assert not model.whiten.weight.requires_grad


# --- the recipe end to end -------------------------------------------------------------------------


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_the_recipe_resumes_mid_epoch_bit_exact_and_test_py_repeats_its_validation(
    stop_at, tmp_path, cifar_dir, pipeline
):
    config = recipe(tmp_path, cifar_dir, type="StopAt", deterministic=True)
    pipe = ["--set", f"data_loader.args.pipeline={json.dumps(pipeline)}"]
    # run_main: the output captured, for the failure message.
    result = run_main("train.py", "-c", str(config), "--run-id", "straight", *pipe)
    assert result.returncode == 0, result.stderr[-3000:]
    stop = ["--set", "trainer.args.stop_at_step=7"]  # 2 batches into epoch 2
    result = run_main("train.py", "-c", str(config), "--run-id", "stopped", *pipe, *stop)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    runs = tmp_path / "saved" / "models" / "Cifar10_FastCifarCNN"
    resume = ["-r", str(runs / "stopped"), "--set", "trainer.args.stop_at_step=0"]
    result = run_main("train.py", *resume)
    assert result.returncode == 0, result.stderr[-3000:]
    a = torch.load(runs / "straight" / "checkpoint-epoch2.pth", weights_only=True)
    b = torch.load(runs / "stopped" / "checkpoint-epoch2.pth", weights_only=True)
    assert all(torch.equal(a["model"][key], b["model"][key]) for key in a["model"])
    untimed = [{k: v for k, v in c["metrics"].items() if not k.startswith("time/")} for c in (a, b)]
    assert untimed[0] == untimed[1]  # the logged "lr" included: the epoch's start
    # Frozen scales stayed 1; the whitening filters are those fitted, the same in both runs.
    scales = [value for key, value in a["model"].items() if key.endswith(("2.weight", "5.weight"))]
    assert scales and all(torch.equal(value, torch.ones_like(value)) for value in scales)
    first = torch.load(runs / "straight" / "checkpoint-epoch1.pth", weights_only=True)
    assert torch.equal(first["model"]["whiten.weight"], a["model"]["whiten.weight"])
    # test.py evaluates as validation did, test-time augmentation included.
    results = tmp_path / "results.json"
    checkpoint = runs / "straight" / "checkpoint-epoch2.pth"
    result = run_main("test.py", "-r", str(checkpoint), "--split", "val", "--json", str(results))
    assert result.returncode == 0, result.stderr[-3000:]
    tested = json.loads(results.read_text())["metrics"]
    assert tested["val/accuracy"] == a["metrics"]["val/accuracy"]
    assert tested["val/loss"] == pytest.approx(a["metrics"]["val/loss"], rel=1e-6)


# --- benchmarks/reencode_jpeg.py: the cost of a JPEG pass (docs/recipes.md) ---------------------


def test_reencoding_copies_the_tree_as_png_with_one_more_lossy_pass_on_a_moved_grid(tmp_path):
    from PIL import Image

    from benchmarks import reencode_jpeg

    rng = np.random.default_rng(0)

    def picture() -> np.ndarray:  # (32, 32, 3) uint8: 8x8 random colours, smoothed, some noise
        small = torch.randint(0, 256, (1, 3, 8, 8), generator=torch.Generator().manual_seed(0))
        big = torch.nn.functional.interpolate(small.float(), size=32, mode="bilinear")
        pixels = big[0].permute(1, 2, 0).numpy() + rng.normal(0, 6, (32, 32, 3))
        return np.clip(pixels, 0, 255).astype(np.uint8)

    for name in ("cat/0.jpg", "cat/1.png", "dog/0.jpg"):
        (tmp_path / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(picture()).save(tmp_path / "in" / name, quality=95)
    assert reencode_jpeg.main([str(tmp_path / "in"), str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert written == ["cat", "cat/0.png", "cat/1.png", "dog", "dog/0.png"]
    before = np.asarray(Image.open(tmp_path / "in" / "cat" / "0.jpg").convert("RGB"))
    after = np.asarray(Image.open(out / "cat" / "0.png"))
    assert after.shape == before.shape
    assert 20 < reencode_jpeg.psnr(before, after) < 40  # lossy, and still the same picture
    # On the image's own grid a second pass at the same quality loses little; on a moved grid
    # it loses about as much as the first pass did: that is why the grid moves.
    once = reencode_jpeg.reencode(picture(), quality=75, shift=0)
    same_grid = reencode_jpeg.psnr(once, reencode_jpeg.reencode(once, quality=75, shift=0))
    moved_grid = reencode_jpeg.psnr(once, reencode_jpeg.reencode(once, quality=75, shift=5))
    assert same_grid > moved_grid + 5
    assert reencode_jpeg.main([str(tmp_path / "empty"), str(tmp_path / "x")]) == 2

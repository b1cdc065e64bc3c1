"""trainer.tta_translate_weight: test-time augmentation's views weighted, an unshifted view 1 and
a shifted one the weight, against the definition written out here from the views' outputs:
per image, per pixel over the views that saw it, and end to end through train.py and test.py."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import NUM_EXAMPLES, run_main
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from utils.evaluation.tta import AverageOverViews

WEIGHTS = st.one_of(st.sampled_from([0.5, 1.0, 2.0]), st.floats(0.05, 20.0))


def moved(images: torch.Tensor, shift: int) -> torch.Tensor:
    """out[..., i, j] = images[..., reflect(i - shift), reflect(j - shift)], by indexing: the
    content moved down-right by shift (up-left for a negative one), its edges mirrored."""

    def reflect(index: int, size: int) -> int:
        index = abs(index)
        return 2 * (size - 1) - index if index > size - 1 else index

    rows = [reflect(i - shift, images.shape[-2]) for i in range(images.shape[-2])]
    columns = [reflect(j - shift, images.shape[-1]) for j in range(images.shape[-1])]
    return images[..., rows, :][..., columns]


def views(flip: bool, translate: int) -> list[tuple[bool, int]]:
    """(mirrored, shift) of each view the options name."""
    shifts = [0, translate, -translate] if translate else [0]
    return [
        (mirrored, shift) for mirrored in ([False, True] if flip else [False]) for shift in shifts
    ]


def view_outputs(
    model: Callable, images: torch.Tensor, flip: bool, translate: int, weight: float
) -> tuple[list[torch.Tensor], list[float]]:
    """Each view's output on its own pixels, and its weight: 1 unshifted, `weight` shifted."""
    outputs, weights = [], []
    for mirrored, shift in views(flip, translate):
        outputs.append(model(moved(images.flip(-1) if mirrored else images, shift)))
        weights.append(weight if shift else 1.0)
    return outputs, weights


def weighted(outputs: list[torch.Tensor], weights: list[float], average: str) -> torch.Tensor:
    """sum_v w_v x_v / sum_v w_v: of the outputs, or (log of it) of their softmax over dim 1."""
    total = sum(weights)
    if average == "logits":
        return sum(w * x for w, x in zip(weights, outputs, strict=True)) / total
    mean = sum(w * x.softmax(dim=1) for w, x in zip(weights, outputs, strict=True)) / total
    return mean.log()


def classifier(size: int, num_outputs: int, seed: int) -> nn.Module:
    """A small random model of images (B, 3, size, size) with num_outputs outputs (B, K); 0:
    one value per image (B,)."""
    torch.manual_seed(seed)
    head = nn.Linear(4 * size * size, max(num_outputs, 1))
    layers = [nn.Conv2d(3, 4, 1), nn.Flatten(), head] + ([nn.Flatten(0)] if not num_outputs else [])
    return nn.Sequential(*layers).eval()


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_outputs_per_image_are_the_weighted_mean_of_the_views(num_examples):
    """(B, K) and (B,): the normalised weighted mean, of logits or of probabilities; weight 1
    is the plain mean over the views, as before the weight existed."""

    @settings(max_examples=num_examples)
    @given(
        batch=st.integers(1, 4),
        size=st.integers(2, 9),
        flip=st.booleans(),
        translate=st.integers(0, 8),
        weight=WEIGHTS,
        num_outputs=st.sampled_from([0, 1, 5]),
        average=st.sampled_from(["logits", "probabilities"]),
        seed=st.integers(0, 2**16),
    )
    def check(batch, size, flip, translate, weight, num_outputs, average, seed):
        translate = min(translate, size - 1)
        # (B,) and (B, 1) have no classes to softmax (a one-score head is refused)
        average = "logits" if num_outputs < 2 else average
        model = classifier(size, num_outputs, seed)
        images = torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            outputs, weights = view_outputs(model, images, flip, translate, weight)
            averaged = AverageOverViews(
                model, flip=flip, translate=translate, average=average, translate_weight=weight
            )(images)
            torch.testing.assert_close(averaged, weighted(outputs, weights, average))
            if weight == 1.0:
                mean = torch.stack(outputs).mean(dim=0)
                mean = (
                    mean if average == "logits" else torch.stack(outputs).softmax(2).mean(0).log()
                )
                torch.testing.assert_close(averaged, mean)

    check()


def mapped_back(
    output: torch.Tensor, mirrored: bool, shift: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A dense view's output (B, C, H, W) on the input's pixels, by slicing, and its 0/1 mask
    (1, 1, H, W): the view's pixel (i + shift, j + shift) is the input's (i, j)."""
    height, width = output.shape[-2:]
    back, seen = torch.zeros_like(output), torch.zeros(1, 1, height, width)
    size = abs(shift)
    view = (
        (slice(size, None), slice(size, None))
        if shift > 0
        else (slice(None, height - size), slice(None, width - size))
    )
    own = (
        (slice(None, height - size), slice(None, width - size))
        if shift > 0
        else (slice(size, None), slice(size, None))
    )
    back[..., own[0], own[1]] = output[..., view[0], view[1]]
    seen[..., own[0], own[1]] = 1.0
    return (back.flip(-1), seen.flip(-1)) if mirrored else (back, seen)


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_dense_outputs_weigh_each_pixel_over_the_views_that_saw_it(num_examples):
    """(B, C, H, W): at each pixel, each view's weight times whether it saw the pixel,
    normalised by the sum of those; a 3x3 convolution, so the views do differ."""

    @settings(max_examples=num_examples)
    @given(
        batch=st.integers(1, 3),
        height=st.integers(1, 8),
        width=st.integers(1, 8),
        flip=st.booleans(),
        translate=st.integers(0, 7),
        weight=WEIGHTS,
        average=st.sampled_from(["logits", "probabilities"]),
        seed=st.integers(0, 2**16),
    )
    def check(batch, height, width, flip, translate, weight, average, seed):
        translate = min(translate, min(height, width) - 1)
        torch.manual_seed(seed)
        model = nn.Conv2d(2, 3, 3, padding=1).eval()
        images = torch.rand(batch, 2, height, width)
        with torch.no_grad():
            outputs, weights = view_outputs(model, images, flip, translate, weight)
            numerator, total = 0.0, 0.0
            for output, w, (mirrored, shift) in zip(
                outputs, weights, views(flip, translate), strict=True
            ):
                back, seen = mapped_back(output, mirrored, shift)
                share = back if average == "logits" else back.softmax(dim=1)
                numerator, total = numerator + w * seen * share, total + w * seen
            expected = numerator / total if average == "logits" else (numerator / total).log()
            averaged = AverageOverViews(
                model, flip=flip, translate=translate, average=average, translate_weight=weight
            )(images)
            torch.testing.assert_close(averaged, expected, rtol=1e-5, atol=1e-5)

    check()


class Constant(nn.Module):
    """The same output c for every image: (B, K), or dense (B, K, H, W) at the input's size."""

    def __init__(self, value: float, dense: bool) -> None:
        super().__init__()
        self.value, self.dense = value, dense

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        shape = (len(images), 4, *images.shape[-2:]) if self.dense else (len(images), 4)
        return torch.full(shape, self.value)


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_the_weights_are_normalised(num_examples):
    """An output that is c in every view averages to c (its log-softmax, for probabilities)
    whatever the weight: at every pixel too, where fewer views saw it."""

    @settings(max_examples=num_examples)
    @given(
        value=st.floats(-50.0, 50.0),
        dense=st.booleans(),
        flip=st.booleans(),
        translate=st.integers(1, 4),
        weight=WEIGHTS,
        average=st.sampled_from(["logits", "probabilities"]),
    )
    def check(value, dense, flip, translate, weight, average):
        model = Constant(value, dense)
        images = torch.rand(2, 3, 6, 6)
        expected = model(images)
        expected = expected if average == "logits" else expected.log_softmax(dim=1)
        averaged = AverageOverViews(
            model, flip=flip, translate=translate, average=average, translate_weight=weight
        )
        torch.testing.assert_close(averaged(images), expected)

    check()


def test_half_weight_is_the_cifar10_records_weighting():
    """airbench94's six views: 0.25 for the image and for its mirror image, 0.125 for each of
    the four shifted by one pixel, written out view by view."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).eval()
    images = torch.randn(6, 3, 8, 8)
    mirror = images.flip(-1)
    with torch.no_grad():
        plain = [model(images), model(mirror)]
        shifted = [model(moved(view, shift)) for view in (images, mirror) for shift in (1, -1)]
        expected = 0.25 * (plain[0] + plain[1]) + 0.125 * sum(shifted)
        options = {"flip": True, "translate": 1, "translate_weight": 0.5}
        logits = AverageOverViews(model, average="logits", **options)(images)
        torch.testing.assert_close(logits, expected)
        probabilities = 0.25 * sum(x.softmax(-1) for x in plain) + 0.125 * sum(
            x.softmax(-1) for x in shifted
        )
        averaged = AverageOverViews(model, average="probabilities", **options)(images)
        torch.testing.assert_close(averaged.exp(), probabilities)
        # ... and not the equal weights: the weight changed what comes out.
        assert not torch.allclose(logits, torch.stack(plain + shifted).mean(dim=0))


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_tta_of_an_identity_is_the_identity_whatever_the_weight(num_examples):
    @settings(max_examples=num_examples)
    @given(
        height=st.integers(1, 9),
        width=st.integers(1, 9),
        flip=st.booleans(),
        translate=st.integers(0, 8),
        weight=WEIGHTS,
        average=st.sampled_from(["logits", "probabilities"]),
        seed=st.integers(0, 2**16),
    )
    def check(height, width, flip, translate, weight, average, seed):
        translate = min(translate, min(height, width) - 1)
        images = torch.rand(2, 3, height, width, generator=torch.Generator().manual_seed(seed))
        expected = images if average == "logits" else images.log_softmax(dim=1)
        averaged = AverageOverViews(
            nn.Identity(), flip=flip, translate=translate, average=average, translate_weight=weight
        )
        torch.testing.assert_close(averaged(images), expected, rtol=1e-6, atol=1e-6)

    check()


def test_validation_and_test_py_weigh_the_views_as_the_config_says(make_config, tmp_path: Path):
    """train.py validates with the weight and test.py on its checkpoint reproduces that; --set
    another weight changes the result, and a weight with no shifted views is refused."""
    tta = {
        "trainer.tta_flip": True,
        "trainer.tta_translate": 1,
        "trainer.tta_translate_weight": 0.5,
    }
    config = make_config(**{"trainer.epochs": 1, **tta})
    trained = run_main("train.py", "-c", str(config), "--run-id", "weighted")
    assert trained.returncode == 0, trained.stderr[-3000:]
    checkpoint = (
        tmp_path / "saved" / "models" / "Demo_CifarCNN" / "weighted" / "checkpoint-epoch1.pth"
    )
    recorded = torch.load(checkpoint, weights_only=True)["metrics"]

    def tested(*overrides: str) -> dict:
        report = tmp_path / "report.json"
        result = run_main(
            "test.py", "-r", str(checkpoint), "--split", "val", "--json", str(report), "--force",
            *overrides,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(report.read_text())["metrics"]

    assert tested()["val/loss"] == pytest.approx(recorded["val/loss"], rel=1e-6)
    # A 1-epoch model's views differ little (weight 1 moved val/loss by 5e-7 of it); the
    # shifted views 40 times heavier than at 0.5 move it by 3e-5.
    heavier = tested("--set", "trainer.tta_translate_weight=20")
    assert heavier["val/loss"] != pytest.approx(recorded["val/loss"], rel=1e-6)
    refused = run_main("test.py", "-r", str(checkpoint), "--set", "trainer.tta_translate=0")
    assert refused.returncode == 2
    assert (
        "trainer.tta_translate_weight: weighs the shifted views, and trainer.tta_translate is 0"
        in refused.stderr
    )

"""What validation counts (issue 31, items 7 and 14): every shipped metric equals scikit-learn's
or torchmetrics' on the whole split, whatever the batches, their order and the number of ranks,
for random shapes, dtypes, means and scales; none makes a tensor whose size depends on the data
(a host sync on CUDA); each refuses what would broadcast."""

import itertools
import math

import pytest
import torch
from conftest import NUM_EXAMPLES
from hypothesis import given, settings
from hypothesis import strategies as st

import model.metric as metric_module
from model.metric import F1, R2, RMSE, accuracy, psnr, top_5_acc, top_k_acc
from utils.evaluation.metric_sums import MetricSums, StepOutput, to_metrics
from utils.util import DataError

# Every metric model/metric.py ships, built as a config names it.
SHIPPED = {
    "accuracy": accuracy,
    "top_k_acc": top_k_acc,
    "top_5_acc": top_5_acc,
    "psnr": psnr,
    "RMSE": RMSE(),
    "R2": R2(),
    "F1": F1(num_classes=4),
}
CLASSIFICATION = ("accuracy", "top_k_acc", "top_5_acc", "F1")
FLOATS = [torch.float32, torch.bfloat16, torch.float16]


def value_over(
    metric: object, output: torch.Tensor, target: torch.Tensor, split: dict | None = None
) -> float:
    """The metric over the samples in split["order"], cut into batches at split["cuts"], the
    batches dealt out to split["num_ranks"] ranks in turn: each rank's sums, added together as
    the all-reduce does. Without a split: one batch of the samples in order, one rank."""
    split = split or {"order": list(range(len(target))), "cuts": [], "num_ranks": 1}
    order = split["order"]
    output, target = output[order], target[order]
    bounds = [0, *split["cuts"], len(order)]
    batches = [(output[a:b], target[a:b]) for a, b in itertools.pairwise(bounds)]
    totals = torch.zeros(())
    for rank in range(split["num_ranks"]):
        sums = MetricSums({"m": metric}, torch.device("cpu"))
        for batch_output, batch_target in batches[rank :: split["num_ranks"]]:
            sums.add(StepOutput(loss=torch.zeros(()), output=batch_output, target=batch_target))
        totals = totals + sums.all_ranks()  # a rank without batches adds zeros
    return to_metrics(totals, {"m": metric}, "val")["val/m"]


@st.composite
def splits(draw: st.DrawFn, num_samples: int) -> dict:
    """A sample order, the cuts between batches and a number of ranks."""
    order = draw(st.permutations(range(num_samples)))
    cuts = draw(st.sets(st.integers(1, num_samples - 1), max_size=6)) if num_samples > 1 else []
    return {"order": order, "cuts": sorted(cuts), "num_ranks": draw(st.integers(1, 3))}


def close(value: float, expected: float, tolerance: float = 1e-9) -> bool:
    """Equal to `tolerance` of the value (and of 1, for values near 0), nan equal to nan."""
    if math.isnan(expected):
        return math.isnan(value)
    return math.isclose(value, expected, rel_tol=tolerance, abs_tol=tolerance)


# --- every metric against its reference, whatever the batches and ranks --------------------------


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_regression_metrics_equal_scikit_learn_whatever_the_batches(num_examples):
    metrics = pytest.importorskip("sklearn.metrics")

    @settings(max_examples=num_examples)
    @given(
        num_samples=st.integers(1, 40),
        sample_shape=st.lists(st.integers(1, 3), max_size=2),
        dtypes=st.tuples(st.sampled_from(FLOATS), st.sampled_from(FLOATS)),
        mean=st.floats(-6, 6).map(lambda power: math.copysign(10 ** abs(power), power)),
        scale=st.floats(-3, 3).map(lambda power: 10**power),
        error=st.floats(-4, 1).map(lambda power: 10**power),
        seed=st.integers(0, 2**16),
        data=st.data(),
    )
    def check(num_samples, sample_shape, dtypes, mean, scale, error, seed, data):
        generator = torch.Generator().manual_seed(seed)
        shape = (num_samples, *sample_shape)
        target = mean + scale * torch.randn(shape, generator=generator, dtype=torch.float64)
        output = target + error * scale * torch.randn(shape, generator=generator)
        target, output = target.to(dtypes[0]), output.to(dtypes[1])
        if not (target.isfinite().all() and output.isfinite().all()):
            return  # float16 holds no more than 65504
        y, predicted = target.double().numpy().ravel(), output.double().numpy().ravel()
        constant = y.min() == y.max()  # R² undefined: nan
        expected = {
            "RMSE": metrics.mean_squared_error(y, predicted) ** 0.5,
            "R2": float("nan") if constant else metrics.r2_score(y, predicted),
        }
        split = data.draw(splits(num_samples))
        for name, reference in expected.items():
            whole = value_over(SHIPPED[name], output, target)
            assert close(whole, reference), (name, whole, reference)
            value = value_over(SHIPPED[name], output, target, split)
            assert close(value, whole, 1e-12), (name, value, whole)

    check()


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_psnr_equals_torchmetrics_whatever_the_batches(num_examples):
    image = pytest.importorskip("torchmetrics.functional.image")

    @settings(max_examples=num_examples)
    @given(
        num_samples=st.integers(1, 24),
        sample_shape=st.lists(st.integers(1, 4), max_size=3),
        dtype=st.sampled_from(FLOATS),
        noise=st.floats(-4, 0).map(lambda power: 10**power),
        seed=st.integers(0, 2**16),
        data=st.data(),
    )
    def check(num_samples, sample_shape, dtype, noise, seed, data):
        generator = torch.Generator().manual_seed(seed)
        shape = (num_samples, *sample_shape)
        target = torch.rand(shape, generator=generator).to(dtype)
        output = (target + noise * torch.randn(shape, generator=generator)).to(dtype)
        flat = (output.double().reshape(num_samples, -1), target.double().reshape(num_samples, -1))
        if ((flat[0] - flat[1]).square().mean(dim=1) <= 1e-10).any():
            return  # psnr caps each image at 100 dB; torchmetrics does not
        expected = image.peak_signal_noise_ratio(*flat, data_range=1.0, reduction="none", dim=1)
        whole = value_over(psnr, output, target)
        # torchmetrics takes the logarithm in float32 (its data_range and log(10) tensors).
        assert close(whole, expected.double().mean().item(), 1e-6), (whole, expected)
        value = value_over(psnr, output, target, data.draw(splits(num_samples)))
        assert close(value, whole, 1e-12), (value, whole)

    check()


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_classification_metrics_equal_the_references_whatever_the_batches(num_examples):
    """Logits (B, C) against labels (B,), or per pixel: (B, C, H, W) against masks (B, H, W)."""
    metrics = pytest.importorskip("sklearn.metrics")
    classification = pytest.importorskip("torchmetrics.functional.classification")

    @settings(max_examples=num_examples)
    @given(
        num_samples=st.integers(1, 30),
        num_classes=st.integers(2, 6),
        pixels=st.lists(st.integers(1, 4), max_size=2),
        dtype=st.sampled_from(FLOATS),
        seed=st.integers(0, 2**16),
        data=st.data(),
    )
    def check(num_samples, num_classes, pixels, dtype, seed, data):
        generator = torch.Generator().manual_seed(seed)
        logits = torch.randn(num_samples, num_classes, *pixels, generator=generator).to(dtype)
        target = torch.randint(num_classes, (num_samples, *pixels), generator=generator)

        def share(k: int) -> float:  # each sample's share of right elements, averaged
            # torchmetrics' counts (its accuracy itself is float32): right, wrong per sample
            counts = classification.multiclass_stat_scores(
                logits.float(), target, num_classes, top_k=min(k, num_classes),
                average="micro", multidim_average="samplewise" if pixels else "global",
            ).double()  # fmt: skip
            right, wrong = counts[..., 0], counts[..., 3]
            return (right / (right + wrong)).mean().item()

        predicted = logits.argmax(dim=1).ravel().numpy()
        expected = {
            "accuracy": share(1),
            "top_k_acc": share(3),
            "top_5_acc": share(5),
            "F1": metrics.f1_score(target.ravel().numpy(), predicted, average="macro"),
        }
        split = data.draw(splits(num_samples))
        for name, reference in expected.items():
            metric = F1(num_classes) if name == "F1" else SHIPPED[name]
            whole = value_over(metric, logits, target)
            assert close(whole, reference), (name, whole, reference)
            value = value_over(metric, logits, target, split)
            assert close(value, whole, 1e-12), (name, value, whole)

    check()


@pytest.mark.parametrize(("mean", "spread"), [(300.0, 1.0), (1e4, 1.0), (1e6, 1.0)])
def test_r2_of_targets_with_a_large_mean_is_exact(mean, spread):
    """The reported example: float32 sums of y and y^2 cancelled (error 3.6e-4 at mean 300, 0.051
    at 1e4); float64 sums alone still lose 4 digits at 1e6."""
    metrics = pytest.importorskip("sklearn.metrics")
    generator = torch.Generator().manual_seed(0)
    target = mean + spread * torch.randn(1000, 1, generator=generator)
    output = target + 0.5 * spread * torch.randn(1000, 1, generator=generator)
    expected = metrics.r2_score(target.double().numpy(), output.double().numpy())
    split = {"order": list(range(1000)), "cuts": list(range(64, 1000, 64)), "num_ranks": 1}
    assert abs(value_over(R2(), output, target, split) - expected) < 1e-12


def test_accuracy_of_a_segmentation_counts_pixels():
    """Logits (B, C, H, W) against masks (B, H, W): the share of right pixels, where the right
    pixels were counted per image (up to H x W each)."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 3, 8, 8, generator=generator)
    masks = torch.randint(3, (4, 8, 8), generator=generator)
    right = (logits.argmax(dim=1) == masks).double().mean().item()
    split = {"order": list(range(4)), "cuts": [1, 3], "num_ranks": 2}
    assert value_over(accuracy, logits, masks, split) == pytest.approx(right, rel=1e-12)
    assert value_over(top_k_acc, logits, masks, split) == 1.0  # 3 classes, k = 3


# --- shapes each metric refuses ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "output", "target", "message"),
    [
        ("RMSE", (8, 1), (8,), r"RMSE: needs an output and a target of one shape \(B, \.\.\.\), "
         r"got \(8, 1\) float32 and \(8,\) float32"),
        ("R2", (8,), (8, 1), r"R2: needs an output and a target of one shape"),
        ("psnr", (2, 3, 4, 4), (2, 1, 4, 4), r"psnr: needs an output and a target of one shape"),
        ("accuracy", (8, 3), (8, 1), r"accuracy: needs class scores \(B, C, \.\.\.\) and integer "
         r"class indices \(B, \.\.\.\), got an output \(8, 3\) float32 and a target \(8, 1\)"),
        ("top_k_acc", (8, 3, 4), (8, 5), r"top_k_acc: needs class scores"),
        ("top_5_acc", (8,), (8,), r"top_5_acc: needs class scores"),
        ("accuracy", (8, 3), "float", r"accuracy: .* a target \(8,\) float32"),
        ("F1", (8, 3), (8,), r"F1: needs class scores \(B, 4, \.\.\.\)"),
    ],
)  # fmt: skip
def test_shapes_that_would_broadcast_are_refused_in_one_line(name, output, target, message):
    """Before: RMSE of (B, 1) against (B,) broadcast to (B, B) and reported 1.67 for 0.072."""
    output = torch.zeros(output)
    target = torch.zeros(8) if target == "float" else torch.zeros(target, dtype=torch.long)
    if name in ("RMSE", "R2", "psnr"):
        target = target.float()
    sums = MetricSums({name: SHIPPED[name]}, torch.device("cpu"))
    with pytest.raises(DataError, match=message):
        sums.add(StepOutput(loss=torch.zeros(()), output=output, target=target))


# --- no host sync: nothing whose size depends on the data ----------------------------------------


def test_every_shipped_metric_is_tested_here():
    assert set(SHIPPED) == set(metric_module.__all__)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_metric_runs_on_the_meta_device(name):
    """The meta device has shapes and no values: an op whose output size depends on the values
    (F1's boolean mask and bincount were two) cannot run there, and on CUDA it waits for the
    device every step (tests/test_gpu_paths.py counts the syncs on a GPU)."""
    meta = torch.device("meta")
    if name in CLASSIFICATION:
        output = torch.empty(8, 4, 5, 5, device=meta)
        target = torch.empty(8, 5, 5, dtype=torch.long, device=meta)
    else:
        output, target = torch.empty(8, 3, 5, 5, device=meta), torch.empty(8, 3, 5, 5, device=meta)
    metric = SHIPPED[name]
    sums = (
        metric.batch_sums(output, target)
        if hasattr(metric, "batch_sums")
        else metric(output, target)
    )
    assert sums.device == meta and sums.dim() <= 1

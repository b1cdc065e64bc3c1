"""What validation counts (issue 31, items 2, 7, 13, 14): every shipped metric equals scikit-learn's
or torchmetrics' on the whole split, whatever the batches, their order and the number of ranks,
for random shapes, dtypes, means and scales; none makes a tensor whose size depends on the data
(a host sync on CUDA); each refuses what would broadcast; test-time augmentation of a per-pixel
model is that model, for every output shape it accepts, and refuses the others."""

import itertools
import json
import math
import re

import numpy as np
import pytest
import torch
from conftest import NUM_EXAMPLES, ROOT
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import model.metric as metric_module
from base import StatefulMetric
from data_loader.data_loaders import NoisyShapesDataLoader
from model.metric import (
    F1,
    R2,
    RMSE,
    MeanIoU,
    PixelAccuracy,
    accuracy,
    psnr,
    top_5_acc,
    top_k_acc,
)
from utils.evaluation.confusion import ConfusionMatrix
from utils.evaluation.metric_sums import MetricSums, StepOutput, to_metrics
from utils.evaluation.tta import AverageOverViews
from utils.util import ConfigValueError, DataError, UserError

# Every metric model/metric.py ships, built as a config names it.
SHIPPED = {
    "accuracy": accuracy,
    "top_k_acc": top_k_acc,
    "top_5_acc": top_5_acc,
    "psnr": psnr,
    "RMSE": RMSE(),
    "R2": R2(num_outputs=75),  # the shape the tests below give every metric: (8, 3, 5, 5)
    "F1": F1(num_classes=4),
    "MeanIoU": MeanIoU(num_classes=4),
    "PixelAccuracy": PixelAccuracy(num_classes=4),
}
CLASSIFICATION = ("accuracy", "top_k_acc", "top_5_acc", "F1", "MeanIoU", "PixelAccuracy")
# Metrics of detections (lists of dicts, not tensors), which keep their own state: tested against
# torchmetrics for any batch cut and on two ranks in tests/test_task_detection.py.
DETECTION = ("MeanAveragePrecision",)
FLOATS = [torch.float32, torch.bfloat16, torch.float16]


def value_over(
    metric: object, output: torch.Tensor, target: torch.Tensor, split: dict | None = None
) -> float:
    """The metric over the samples in split["order"], cut into batches at split["cuts"], the
    batches dealt out to split["num_ranks"] ranks in turn: each rank's sums, added together as
    the all-reduce does. Without a split: one batch of the samples in order, one rank."""
    return metrics_over(metric, output, target, split)["val/m"]


def metrics_over(
    metric: object, output: torch.Tensor, target: torch.Tensor, split: dict | None = None
) -> dict[str, float]:
    """What value_over computes, as the engine logs it: {"val/m": value, "val/m/<part>": ...,
    "val/loss", "val/num_samples"}, the metric's breakdown included."""
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
    return to_metrics(totals, {"m": metric}, "val")


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
        # (B, K): each of a sample's values is an output, RMSE and R² the mean of theirs
        y = target.double().numpy().reshape(num_samples, -1)
        predicted = output.double().numpy().reshape(num_samples, -1)
        expected = {
            "RMSE": metrics.root_mean_squared_error(y, predicted),
            # by default every value pooled, as torchmetrics' MeanSquaredError(squared=False)
            "pooled RMSE": metrics.root_mean_squared_error(y.ravel(), predicted.ravel()),
            # scikit-learn warns that R² of one sample is undefined, and gives nan
            "R2": float("nan") if num_samples < 2 else metrics.r2_score(y, predicted),
        }
        built = {
            "RMSE": RMSE(num_outputs=y.shape[1]),
            "pooled RMSE": RMSE(),
            "R2": R2(num_outputs=y.shape[1]),
        }
        split = data.draw(splits(num_samples))
        for name, reference in expected.items():
            whole = value_over(built[name], output, target)
            assert close(whole, reference), (name, whole, reference)
            value = value_over(built[name], output, target, split)
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


def confusion_reference(
    predicted: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int | None
) -> dict[str, object]:
    """IoU per class, mean IoU and pixel accuracy from a numpy confusion matrix of the whole
    split, elements whose target is ignore_index (and that class) left out; nan: undefined."""
    predicted, target = predicted.ravel().numpy(), target.ravel().numpy()
    kept = target != ignore_index if ignore_index is not None else np.ones(len(target), bool)
    matrix = np.zeros((num_classes, num_classes), np.int64)  # [true class, predicted class]
    np.add.at(matrix, (target[kept], predicted[kept]), 1)
    hits, actual, guessed = np.diag(matrix), matrix.sum(axis=1), matrix.sum(axis=0)
    scored = [index for index in range(num_classes) if index != ignore_index]
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = hits / (actual + guessed - hits)  # nan for a class neither true nor predicted
        recall = hits / actual
    present = [index for index in scored if not np.isnan(iou[index])]
    return {
        "iou": {index: float(iou[index]) for index in scored},
        "recall": {index: float(recall[index]) for index in scored},
        "mean_iou": float(iou[present].mean()) if present else math.nan,
        "accuracy": float(hits.sum() / actual.sum()) if actual.sum() else math.nan,
    }


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_dense_metrics_equal_torchmetrics_whatever_the_batches(num_examples):
    """MeanIoU and PixelAccuracy of logits (B, C, ...) against masks (B, ...), with and without
    an ignore_index (a void label outside the classes, or a class such as the background): equal
    to torchmetrics' MulticlassJaccardIndex(average="macro") / MulticlassAccuracy(average="micro")
    and, per class, to a numpy confusion matrix of the whole split, whatever the batch cuts, the
    order and the number of ranks (each rank's sums added as the all-reduce does)."""
    classification = pytest.importorskip("torchmetrics.functional.classification")

    @settings(max_examples=num_examples)
    @given(
        num_samples=st.integers(1, 12),
        num_classes=st.integers(2, 5),
        pixels=st.lists(st.integers(1, 5), max_size=2),
        ignore=st.sampled_from(["none", "void", "class"]),
        dtype=st.sampled_from(FLOATS),
        seed=st.integers(0, 2**16),
        data=st.data(),
    )
    def check(num_samples, num_classes, pixels, ignore, dtype, seed, data):
        generator = torch.Generator().manual_seed(seed)
        logits = torch.randn(num_samples, num_classes, *pixels, generator=generator).to(dtype)
        target = torch.randint(num_classes, (num_samples, *pixels), generator=generator)
        ignore_index = {
            "none": None,
            "void": 255,
            "class": data.draw(st.integers(0, num_classes - 1)),
        }[ignore]
        if ignore == "void":  # about a fifth of the elements unlabelled
            target[torch.rand(target.shape, generator=generator) < 0.2] = 255
        names = [f"class_{index}" for index in range(num_classes)]
        predicted = logits.argmax(dim=1)  # what both compare: ties resolved alike
        reference = confusion_reference(predicted, target, num_classes, ignore_index)
        options = {"num_classes": num_classes, "ignore_index": ignore_index, "average": "macro"}
        torchmetrics_iou = classification.multiclass_jaccard_index(predicted, target, **options)
        options["average"] = "micro"
        torchmetrics_accuracy = classification.multiclass_accuracy(predicted, target, **options)
        split = data.draw(splits(num_samples))
        for metric, value, per_class, theirs in [
            (MeanIoU, reference["mean_iou"], reference["iou"], torchmetrics_iou),
            (PixelAccuracy, reference["accuracy"], reference["recall"], torchmetrics_accuracy),
        ]:
            built = metric(num_classes, ignore_index, per_class=True, class_names=names)
            whole = metrics_over(built, logits, target)
            assert close(whole["val/m"], value, 1e-12), (metric, whole, value)
            expected_parts = {f"val/m/class_{index}": part for index, part in per_class.items()}
            parts = {key: part for key, part in whole.items() if key.startswith("val/m/")}
            assert parts.keys() == expected_parts.keys()
            assert all(close(parts[key], expected_parts[key], 1e-12) for key in parts), parts
            if not math.isnan(value):  # torchmetrics: 0 where nothing is scored; float32
                assert abs(whole["val/m"] - theirs.item()) < 1e-6, (metric, whole, theirs)
            cut = metrics_over(built, logits, target, split)  # integer counts: exact
            assert cut.keys() == whole.keys()
            assert all(close(cut[key], whole[key], 0.0) for key in whole), (cut, whole)

    check()


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_confusion_matrix_equals_scikit_learn_leaving_out_ignore_index(num_examples):
    """The confusion matrix test.py writes and the trainer logs, of logits (B, C) against labels
    (B,) some of which are the data's ignore_index (an unlabelled sample: -100, 255, or a class
    left out): scikit-learn's of the labelled samples, whatever the batch cuts, the order and
    the number of ranks. A label neither a class nor ignore_index leaves no matrix, on every
    rank alike (the metrics refuse the split), rather than an index error or a wrong one."""
    metrics = pytest.importorskip("sklearn.metrics")

    @settings(max_examples=num_examples)
    @given(
        num_samples=st.integers(1, 30),
        num_classes=st.integers(2, 5),
        ignore=st.sampled_from(["none", -100, 255, "class"]),
        stray=st.booleans(),
        seed=st.integers(0, 2**16),
        data=st.data(),
    )
    def check(num_samples, num_classes, ignore, stray, seed, data):
        generator = torch.Generator().manual_seed(seed)
        logits = torch.randn(num_samples, num_classes, generator=generator)
        target = torch.randint(num_classes, (num_samples,), generator=generator)
        ignore_index = {"none": None, "class": data.draw(st.integers(0, num_classes - 1))}.get(
            ignore, ignore
        )
        if isinstance(ignore, int):  # about a third of the samples unlabelled
            target[torch.rand(num_samples, generator=generator) < 0.3] = ignore
        if stray:  # one label that is no class and not ignore_index
            target[data.draw(st.integers(0, num_samples - 1))] = num_classes + 7
        split = data.draw(splits(num_samples))
        order, bounds = split["order"], [0, *split["cuts"], num_samples]
        totals = torch.zeros(num_classes * num_classes + 1, dtype=torch.int64)
        for rank in range(split["num_ranks"]):  # each rank's counts, added as the all-reduce does
            matrix = ConfusionMatrix(num_classes, torch.device("cpu"), ignore_index)
            for start, end in list(itertools.pairwise(bounds))[rank :: split["num_ranks"]]:
                rows = order[start:end]
                matrix.add(StepOutput(torch.zeros(()), logits[rows], target[rows]))
            totals += matrix.counts
        matrix.counts = totals  # all_ranks on one process: the sum is the rank's own
        counts = matrix.all_ranks()
        if stray:
            assert counts is None
            return
        kept = target != ignore_index if ignore_index is not None else torch.ones_like(target) > 0
        expected = np.zeros((num_classes, num_classes), np.int64)  # scikit-learn refuses none
        if kept.any():
            expected = metrics.confusion_matrix(
                target[kept], logits.argmax(dim=1)[kept], labels=range(num_classes)
            )
        assert counts.tolist() == expected.tolist()

    check()


def test_mean_iou_of_a_small_mask_by_hand():
    """Two images of 2 x 2 pixels, classes 0 (background), 1, 2 and the void label 255."""
    target = torch.tensor([[[0, 0], [1, 255]], [[2, 2], [1, 0]]])  # (2, 2, 2)
    predicted = torch.tensor([[[0, 1], [1, 2]], [[2, 0], [1, 0]]])
    logits = torch.nn.functional.one_hot(predicted, 3).permute(0, 3, 1, 2).float()  # (2, 3, 2, 2)
    # Without the void pixel: class 0: 2 hits of 3 true, 3 predicted (IoU 2/4); class 1: 2 of 2,
    # 3 predicted (2/3); class 2: 1 of 2, 1 predicted (1/2). Right: 5 of 7 pixels.
    iou = MeanIoU(3, ignore_index=255, per_class=True, class_names=["bg", "cat", "dog"])
    values = metrics_over(iou, logits, target)
    assert values["val/m"] == pytest.approx((1 / 2 + 2 / 3 + 1 / 2) / 3, rel=1e-12)
    assert [values[f"val/m/{name}"] for name in ("bg", "cat", "dog")] == [0.5, 2 / 3, 0.5]
    assert value_over(PixelAccuracy(3, ignore_index=255), logits, target) == 5 / 7
    # The foreground alone (ignore_index 0; the void pixel now labelled 1, predicted 2): the
    # background's pixels out, class 1: 2 hits of 3 true, 2 predicted (IoU 2/3); class 2: 1 of 2
    # true, 2 predicted (1/3).
    target[0, 1, 1] = 1
    foreground = metrics_over(MeanIoU(3, ignore_index=0, per_class=True), logits, target)
    assert foreground == pytest.approx(
        {"val/loss": 0.0, "val/m": (2 / 3 + 1 / 3) / 2, "val/m/1": 2 / 3, "val/m/2": 1 / 3,
         "val/num_samples": 2.0}, rel=1e-12
    )  # fmt: skip


@pytest.mark.parametrize("metric", [MeanIoU, PixelAccuracy, F1])
def test_targets_that_are_no_class_are_refused_in_one_line_without_a_device_assert(metric):
    """A void label 255 without ignore_index: counted (scatter_add_ with it would be an index
    out of range, a device-side assert on a GPU) and refused when the split's value is read."""
    logits = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    masks = torch.randint(3, (2, 4, 4), generator=torch.Generator().manual_seed(1))
    masks[0, 0, :2], masks[1, 3, 3] = 255, -1
    sums = MetricSums({"m": metric(3)}, torch.device("cpu"))
    sums.add(StepOutput(loss=torch.zeros(()), output=logits, target=masks))
    with pytest.raises(DataError) as error:
        sums.result("val")
    assert str(error.value) == (
        f"{metric.__name__}: 3 targets were outside the classes 0..2; a label for unlabelled "
        "pixels (e.g. 255) needs ignore_index, more classes need num_classes"
    )
    with pytest.raises(DataError, match=r": 1 targets were outside the classes 0..2 nor "):
        value_over(metric(3, ignore_index=255), logits, masks)  # the -1 is still no class
    masks[1, 3, 3] = 255
    assert 0 <= value_over(metric(3, ignore_index=255), logits, masks) <= 1


def test_a_mid_epoch_checkpoint_of_other_metrics_is_refused_in_one_line():
    """Its sums (F1 of 3 classes: 9 counts, before the count of targets outside the classes)
    cannot be added to those of the metrics now: one line, not a broadcast error."""
    saved = {"totals": torch.zeros(11, dtype=torch.float64), "logged": torch.zeros(11)}
    with pytest.raises(UserError) as error:
        MetricSums({"F1": F1(3)}, torch.device("cpu"), saved)
    assert str(error.value) == (
        "the mid-epoch checkpoint kept 9 metric sums, the metrics configured now take 10: resume "
        "with the metrics it was saved with, or from a checkpoint saved at the end of an epoch"
    )
    fitting = {"totals": torch.ones(12, dtype=torch.float64), "logged": torch.zeros(12)}
    assert MetricSums({"F1": F1(3)}, torch.device("cpu"), fitting).totals.tolist() == [1.0] * 12


class Share(StatefulMetric):
    """A toy: the share of positive outputs, with (breakdown) the counts it came from."""

    num_sums = 2

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.stack([(output > 0).sum(), output.new_full((), output.numel())])

    def compute(self, sums: list[float]) -> float:
        return sums[0] / sums[1]


class ShareAndCounts(Share):
    def breakdown(self, sums: list[float]) -> dict[str, float]:
        return {"positive": sums[0], "all": sums[1]}


def test_a_stateful_metric_logs_its_breakdown_beside_its_value():
    """StatefulMetric.breakdown: by default nothing; else each value as <split>/<metric>/<key>,
    from the same summed counts as the metric's own value."""
    output = torch.tensor([[1.0], [-1.0], [2.0], [0.5]])
    split = {"order": [3, 2, 1, 0], "cuts": [1, 2], "num_ranks": 2}
    plain = metrics_over(Share(), output, output, split)
    assert plain == {"val/loss": 0.0, "val/m": 0.75, "val/num_samples": 4.0}
    with_parts = metrics_over(ShareAndCounts(), output, output, split)
    assert with_parts == {**plain, "val/m/positive": 3.0, "val/m/all": 4.0}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"num_classes": 0}, r"num_classes: must be an integer >= 1, got 0"),
        ({"num_classes": 3, "ignore_index": 1.5}, r"ignore_index: must be an integer or null"),
        ({"num_classes": 3, "class_names": ["a", "b"]}, r"num_classes is 3 but class_names .* 2"),
    ],
)
def test_dense_metric_arguments_that_cannot_work_are_refused(args, message):
    with pytest.raises(ConfigValueError, match=message):
        MeanIoU(**args)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"num_train": 4e3}, "num_train must be an integer >= 1, got 4000.0"),  # JSON's 4e3
        ({"num_train": -5}, "num_train must be an integer >= 1, got -5"),
        ({"num_test": 0}, "num_test must be an integer >= 1, got 0"),
        ({"noise_std": "0.2"}, "noise_std must be a number > 0, got '0.2'"),
        ({"noise_std": 0}, "noise_std must be a number > 0, got 0"),
    ],
)
def test_denoising_data_arguments_that_cannot_work_are_refused(args, message):
    """configs/denoise.json's data, as SyntheticDataLoader's: a config error, not a traceback."""
    with pytest.raises(ConfigValueError, match=re.escape(message)):
        NoisyShapesDataLoader(**{"num_train": 40, "num_test": 8, **args}, batch_size=4, seed=0)


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


def test_r2_of_two_outputs_is_the_mean_of_their_r2():
    """The reported case: R2 pooled every value of (B, 2) targets into one SSE and one SST: 0.9998
    here where scikit-learn and torchmetrics give the mean of each output's R², 0.5."""
    target = torch.tensor([[0.0, 100.0], [1.0, 101.0], [2.0, 102.0], [3.0, 103.0]])
    output = target.clone()
    output[:, 1] = 101.5  # the second output's mean: its R² is 0
    split = {"order": [3, 1, 0, 2], "cuts": [1], "num_ranks": 2}
    assert value_over(R2(num_outputs=2), output, target, split) == pytest.approx(0.5, abs=1e-12)


def test_rmse_of_two_outputs_is_the_mean_of_their_rmse():
    """RMSE could only pool every value of (B, 2) targets: sqrt(2) = 1.41 here, where
    scikit-learn's root_mean_squared_error gives the mean of each output's RMSE, (0 + 2) / 2 = 1;
    num_outputs asks for that. By default (torchmetrics') it still pools."""
    target = torch.tensor([[0.0, 100.0], [1.0, 101.0], [2.0, 102.0], [3.0, 103.0]])
    output = target + torch.tensor([0.0, 2.0])  # the first output exact, the second 2 off
    split = {"order": [3, 1, 0, 2], "cuts": [1], "num_ranks": 2}
    assert value_over(RMSE(num_outputs=2), output, target, split) == pytest.approx(1.0, abs=1e-12)
    assert value_over(RMSE(), output, target, split) == pytest.approx(2**0.5, abs=1e-12)


def test_rmse_refuses_a_number_of_outputs_other_than_its_own():
    sums = MetricSums({"RMSE": RMSE(num_outputs=3)}, torch.device("cpu"))
    message = r'RMSE: a sample has 2 target values \(\(4, 2\) float32\) but num_outputs is 3: .*"num_outputs": 2'
    with pytest.raises(DataError, match=message):
        sums.add(
            StepOutput(loss=torch.zeros(()), output=torch.zeros(4, 2), target=torch.zeros(4, 2))
        )
    with pytest.raises(ConfigValueError, match="num_outputs: must be an integer >= 1, got 0"):
        RMSE(num_outputs=0)


def test_r2_of_a_constant_target_is_scikit_learns():
    """A constant target (a tiny validation fold) gave nan, which a monitored "max val/R2" never
    takes as best; scikit-learn gives 1 for exact predictions and 0 otherwise, per output."""
    target = torch.tensor([[2.0, 0.0], [2.0, 1.0], [2.0, 2.0]])
    exact = value_over(R2(num_outputs=2), target, target)
    missed = value_over(R2(num_outputs=2), target + 0.25, target)
    assert (exact, missed) == (1.0, pytest.approx((0 + 1 - 0.1875 / 2) / 2, abs=1e-12))


def test_r2_refuses_a_number_of_outputs_other_than_its_own():
    """One R² for all the values of (B, K) is neither reference's: num_outputs says K."""
    sums = MetricSums({"R2": R2()}, torch.device("cpu"))
    message = r'R2: a sample has 2 target values \(\(4, 2\) float32\) but num_outputs is 1: .*"num_outputs": 2'
    with pytest.raises(DataError, match=message):
        sums.add(
            StepOutput(loss=torch.zeros(()), output=torch.zeros(4, 2), target=torch.zeros(4, 2))
        )
    with pytest.raises(ConfigValueError, match="num_outputs: must be an integer >= 1, got 0"):
        R2(num_outputs=0)


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
        ("MeanIoU", (8, 3, 4, 4), (8, 4, 4), r"MeanIoU: needs class scores \(B, 4, \.\.\.\)"),
        ("PixelAccuracy", (8, 4, 4, 4), (8, 4), r"PixelAccuracy: needs class scores .* a "
         r"target \(8, 4\) int64"),
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
    assert set(SHIPPED) | set(DETECTION) == set(metric_module.__all__)


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


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_an_empty_batch_adds_nothing_to_any_shipped_metric(name):
    """A batch of no samples (a user's collate may yield one) leaves every sum as it was; psnr
    raised on it, reshaping 0 elements to (0, -1)."""
    if name in CLASSIFICATION:
        output, target = torch.randn(0, 4, 5, 5), torch.zeros(0, 5, 5, dtype=torch.long)
    else:
        output, target = torch.rand(0, 3, 5, 5), torch.rand(0, 3, 5, 5)
    metric = SHIPPED[name]
    sums = (
        metric.batch_sums(output, target)
        if hasattr(metric, "batch_sums")
        else metric(output, target)
    )
    assert not sums.any(), sums


# --- test-time augmentation ----------------------------------------------------------------------


def per_pixel_model(channels: int, out_channels: int, seed: int) -> nn.Module:
    """A random 1x1 convolution: moving or mirroring its input moves or mirrors its output."""
    torch.manual_seed(seed)
    return nn.Conv2d(channels, out_channels, 1).eval()


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_tta_of_a_per_pixel_model_is_that_model(num_examples):
    """The identity among them: a denoiser's views mapped back onto the input's pixels, each
    pixel averaging the views that saw it, give back the input."""

    @settings(max_examples=num_examples)
    @given(
        batch=st.integers(1, 4),
        channels=st.integers(1, 4),
        out_channels=st.sampled_from([None, 1, 3]),  # None: the identity
        height=st.integers(1, 9),
        width=st.integers(1, 9),
        flip=st.booleans(),
        translate=st.integers(0, 8),
        average=st.sampled_from(["logits", "probabilities"]),
        seed=st.integers(0, 2**16),
    )
    def check(batch, channels, out_channels, height, width, flip, translate, average, seed):
        translate = min(translate, min(height, width) - 1)
        model = (
            nn.Identity() if out_channels is None else per_pixel_model(channels, out_channels, seed)
        )
        images = torch.rand(
            batch, channels, height, width, generator=torch.Generator().manual_seed(seed)
        )
        with torch.no_grad():
            expected = model(images)
            averaged = AverageOverViews(model, flip=flip, translate=translate, average=average)
            if average == "probabilities" and expected.shape[1] == 1:  # no class scores
                with pytest.raises(DataError, match=r"with K >= 2"):
                    averaged(images)
                return
            if average == "probabilities":
                expected = expected.log_softmax(dim=1)
            torch.testing.assert_close(averaged(images), expected, rtol=1e-6, atol=1e-6)

    check()


def reflect_shift(images: torch.Tensor, shift: int) -> torch.Tensor:
    """out[..., i, j] = images[..., reflect(i + shift), reflect(j + shift)], by indexing: the
    content moved up-left by shift (down-right for a negative one), its edges mirrored."""
    rows = [reflect(i + shift, images.shape[-2]) for i in range(images.shape[-2])]
    columns = [reflect(j + shift, images.shape[-1]) for j in range(images.shape[-1])]
    return images[..., rows, :][..., columns]


def reflect(index: int, size: int) -> int:
    index = -index if index < 0 else index
    return 2 * (size - 1) - index if index > size - 1 else index


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_tta_of_a_classifier_is_the_mean_over_its_views(num_examples):
    """Outputs per image (B, K) average as they are: unchanged by the dense outputs' mapping."""

    @settings(max_examples=num_examples)
    @given(
        batch=st.integers(1, 4),
        size=st.integers(2, 9),
        flip=st.booleans(),
        translate=st.integers(0, 8),
        seed=st.integers(0, 2**16),
    )
    def check(batch, size, flip, translate, seed):
        translate = min(translate, size - 1)
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Flatten(), nn.Linear(4 * size * size, 5))
        images = torch.rand(batch, 3, size, size)
        flips = [images, images.flip(-1)] if flip else [images]
        shifts = [0, translate, -translate] if translate else [0]
        views = [reflect_shift(view, shift) for view in flips for shift in shifts]
        with torch.no_grad():
            logits = torch.stack([model(view) for view in views])  # (V, B, 5)
            mean = AverageOverViews(model, flip=flip, translate=translate, average="logits")
            torch.testing.assert_close(mean(images), logits.mean(dim=0))
            probabilities = AverageOverViews(
                model, flip=flip, translate=translate, average="probabilities"
            )
            torch.testing.assert_close(
                probabilities(images).exp(), logits.softmax(dim=-1).mean(dim=0)
            )

    check()


def test_tta_of_an_identity_denoiser_scores_100_db():
    """The reported example: configs/denoise.json's validation images through a perfect identity
    model with tta_flip scored 13.9 dB (the mirrored view averaged unmirrored), not 100."""
    args = json.loads((ROOT / "configs/denoise.json").read_text())["data_loader"]["args"]
    data = NoisyShapesDataLoader(**{**args, "num_train": 320, "num_workers": 0}, seed=0)
    images, _ = next(iter(data.val_loader()))
    for flip, translate in [(True, 0), (False, 1), (True, 2)]:
        model = AverageOverViews(nn.Identity(), flip=flip, translate=translate, average="logits")
        assert (psnr(model(images), images) / len(images)).item() == pytest.approx(100.0)


@pytest.mark.parametrize(
    ("model", "inputs", "options", "message"),
    [
        (nn.Conv2d(3, 3, 3, stride=2), (2, 3, 8, 8), {"flip": True, "translate": 0},
         r"the model's output \(2, 3, 3, 3\) is neither one output per image \(B, K\) nor one per "
         r"pixel of the input \(2, 3, 8, 8\)"),
        (nn.Flatten(2), (2, 3, 8, 8), {"flip": True, "translate": 0},
         r"the model's output \(2, 3, 64\) is neither"),
        (nn.Identity(), (2, 3, 8, 6), {"flip": False, "translate": 6},
         r"trainer.tta_translate: 6 pixels must be less than the images' height and width, got "
         r"images of 8 x 6"),
        (nn.Identity(), (2, 10), {"flip": True, "translate": 0},
         r"need batches of images \(B, C, H, W\), got inputs of shape \(2, 10\)"),
        (nn.Flatten(0), (2, 3, 4, 4), {"flip": True, "translate": 0, "average": "probabilities"},
         r'tta_average "probabilities": needs class scores \(B, K\) or \(B, K, H, W\) with '
         r"K >= 2, got outputs of shape \(96,\)"),
        # One score a sample (a regression's): its softmax is 1, and the average would be 0.
        (nn.Sequential(nn.Flatten(), nn.Linear(48, 1)), (2, 3, 4, 4),
         {"flip": True, "translate": 0, "average": "probabilities"},
         r"with K >= 2, got outputs of shape \(2, 1\)"),
        (nn.Conv2d(3, 1, 1), (2, 3, 4, 4), {"flip": True, "translate": 1, "average": "probabilities"},
         r"with K >= 2, got outputs of shape \(2, 1, 4, 4\)"),
    ],
)  # fmt: skip
def test_tta_refuses_what_it_cannot_map_back(model, inputs, options, message):
    averaged = AverageOverViews(model, **{"average": "logits", **options})
    with pytest.raises(DataError, match=message):
        averaged(torch.zeros(inputs))


class Detections(nn.Module):
    """A detector's evaluation call: a list of dicts per image, or losses given targets."""

    def forward(self, images: torch.Tensor, targets: list | None = None) -> list | dict:
        if targets is not None:
            return {"box": images.sum()}
        return [{"boxes": torch.zeros(0, 4)} for _ in images]


def test_tta_refuses_outputs_that_are_not_tensors_and_calls_with_more_than_the_images():
    averaged = AverageOverViews(Detections(), flip=True, translate=0, average="logits")
    images = torch.zeros(2, 3, 8, 8)
    with pytest.raises(DataError, match=r"the model's output is a list, not a tensor"):
        averaged(images)
    with pytest.raises(DataError, match=r"the step calls the model with 2 arguments"):
        averaged(images, [{"boxes": torch.zeros(0, 4)}] * 2)

"""K-fold cross-validation end to end: one train.py --folds 3 and one test.py on a fold's
checkpoint, resuming a fold, a single fold and the summary. All in-process (train.main, conftest's
run_main): what is checked is what they write and print, not the process."""

import fcntl
import json
import logging
import shutil
import statistics
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, run_main, shrink
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import data_loader.data_loaders as data_module
import train
import utils.state.folds as folds_module
from model.metric import F1, R2, RMSE, MeanIoU, accuracy, sample_mean_names, top_k_acc
from parse_config import ConfigParser
from utils.distributed.process_group import ProcessInfo
from utils.evaluation.metric_sums import MetricSums, StepOutput
from utils.state.folds import RESULT, SUMMARY, summarize_folds, summary_lines

RUN = Path("models") / "Demo_CifarCNN"


@pytest.fixture(scope="module")
def cross_validated(tmp_path_factory) -> dict:
    """train.py --folds 3 on the shrunk demo config (320 samples, 2 epochs), run id "cv"."""
    tmp_path = tmp_path_factory.mktemp("folds")
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["trainer"]["tensorboard"] = False
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(config))
    result = run_main("train.py", "-c", str(config_path), "--folds", "3", "--run-id", "cv")
    assert result.returncode == 0, result.stderr[-3000:]
    return {"save_dir": tmp_path / "saved", "config_path": config_path, "stdout": result.stdout}


def best_metrics(fold_dir: Path) -> dict:
    return torch.load(fold_dir / "model_best.pth", weights_only=True)["metrics"]


def test_k_fold_writes_fold_folders_and_a_summary_of_their_best_values(cross_validated):
    save_dir = cross_validated["save_dir"]
    run_dir = save_dir / RUN / "cv"
    log_dir = save_dir / "log" / "Demo_CifarCNN" / "cv"
    folds = [f"fold-{fold}" for fold in range(3)]
    assert sorted(path.name for path in run_dir.iterdir()) == [*folds, SUMMARY]
    assert sorted(path.name for path in log_dir.iterdir()) == [*folds, "info.log"]
    for fold, name in enumerate(folds):
        config = json.loads((run_dir / name / "config.json").read_text())
        assert config["data_loader"]["args"]["folds"] == 3
        assert config["data_loader"]["args"]["fold"] == fold
        assert (run_dir / name / "checkpoint-epoch2.pth").is_file()
        assert "epoch 2/2" in (log_dir / name / "info.log").read_text()

    summary = json.loads((run_dir / SUMMARY).read_text())
    assert summary["num_folds"] == 3 and summary["monitor"] == "max val/accuracy"
    assert list(summary["metrics"]) == ["val/accuracy", "val/loss", "val/top_k_acc"]
    for key, values in summary["metrics"].items():
        expected = [best_metrics(run_dir / name)[key] for name in folds]
        assert values["folds"] == expected
        assert values["mean_over_folds"] == pytest.approx(statistics.fmean(expected))
        assert values["std_over_folds"] == pytest.approx(statistics.stdev(expected))
        # 320 samples, the validation folds' sizes differ: each fold's mean weighs its samples.
        counts = [json.loads((run_dir / name / RESULT).read_text())["num_val_samples"]
                  for name in folds]  # fmt: skip
        assert sorted(counts) == [106, 107, 107]
        pooled = sum(v * n for v, n in zip(expected, counts, strict=True)) / sum(counts)
        assert values["pooled"] == pytest.approx(pooled, rel=1e-12)
    assert summary["not_pooled"] == {}
    # The same numbers in the run's own log, below the folds' logs.
    info_log = (log_dir / "info.log").read_text()
    accuracy = summary["metrics"]["val/accuracy"]
    assert (
        f"val/accuracy         pooled {accuracy['pooled']:.4f}   mean over folds "
        f"{accuracy['mean_over_folds']:.4f} +- "
    ) in info_log
    assert "Cross-validation over 3 folds" in cross_validated["stdout"]


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_test_py_on_a_fold_checkpoint_evaluates_that_fold(cross_validated, tmp_path):
    fold_dir = cross_validated["save_dir"] / RUN / "cv" / "fold-1"
    output = tmp_path / "val.json"
    result = run_main(
        "test.py", "-r", str(fold_dir / "model_best.pth"), "--split", "val", "--json", str(output)
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(output.read_text())
    recorded = best_metrics(fold_dir)
    config = json.loads((fold_dir / "config.json").read_text())
    data = ConfigParser(config, source="test").init_obj("data_loader", data_module, seed=0)
    assert report["num_samples"] == len(data.split_indices()[1]) == 107
    assert report["metrics"]["val/accuracy"] == recorded["val/accuracy"]
    assert report["metrics"]["val/loss"] == pytest.approx(recorded["val/loss"], rel=1e-6)


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_the_last_fold_to_finish_writes_the_summary(cross_validated, tmp_path, capsys):
    save_dir = tmp_path / "saved"
    shutil.copytree(cross_validated["save_dir"], save_dir)
    run_dir = save_dir / RUN / "cv"
    original = json.loads((run_dir / SUMMARY).read_text())
    (run_dir / SUMMARY).unlink()
    (run_dir / "fold-2" / "result.json").unlink()  # as if fold 2 were still running elsewhere
    config = json.loads((run_dir / "fold-2" / "config.json").read_text())
    config["trainer"]["save_dir"] = str(save_dir)
    (run_dir / "fold-2" / "config.json").write_text(json.dumps(config))
    assert summarize_folds(run_dir, 3, ("max", "val/accuracy")) is None

    # Resuming fold 2's last checkpoint finishes it (nothing left to train): the summary follows.
    assert train.main(["-r", str(run_dir / "fold-2" / "checkpoint-epoch2.pth")]) == 0
    assert json.loads((run_dir / SUMMARY).read_text()) == original
    assert "All 2 epochs are already done" in capsys.readouterr().out

    # Run again, the finished fold gives the same result: the summary file is left as it was
    # (not replaced by an equal copy, which whatever watches or syncs it would see as new).
    written = (run_dir / SUMMARY).stat()
    assert train.main(["-r", str(run_dir / "fold-2" / "checkpoint-epoch2.pth")]) == 0
    again = (run_dir / SUMMARY).stat()
    assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_one_fold_alone_trains_only_that_fold(cross_validated, tmp_path, capsys):
    save_dir = cross_validated["save_dir"].parent / "single"
    argv = ["-c", str(cross_validated["config_path"]), "--folds", "3", "--fold", "1"]
    argv += ["--run-id", "one", "--epochs", "1", "--set", f"trainer.save_dir={save_dir}"]
    assert train.main(argv) == 0
    run_dir = save_dir / RUN / "one"
    assert [path.name for path in run_dir.iterdir()] == ["fold-1"]
    assert json.loads((run_dir / "fold-1" / "result.json").read_text())["fold"] == 1
    assert "Fold 1 finished; folds_summary.json follows when every fold (0 to 2) has." in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize("script", ["train.py", "test.py"])
def test_the_run_folder_of_a_cross_validation_is_refused_naming_a_fold(
    cross_validated, script, capsys
):
    """-r <run folder> of a cross-validation: it holds no config.json and no checkpoint of its
    own, only fold-<i>/ folders; the error names one to give instead."""
    run_dir = cross_validated["save_dir"] / RUN / "cv"
    result = run_main(script, "-r", str(run_dir))
    assert result.returncode == 2
    assert result.stderr == (
        f"error: {run_dir}: the run folder of a cross-validation; name one of its folds, e.g. "
        f"-r {run_dir / 'fold-0'}\n"
    )


def test_summary_lines():
    summary = {
        "num_folds": 2,
        "monitor": "min val/loss",
        "metrics": {
            "val/loss": {
                "pooled": 0.45,
                "mean_over_folds": 0.5,
                "std_over_folds": 0.25,
                "folds": [0.25, 0.75],
            },
            "val/f1": {"mean_over_folds": 0.5, "std_over_folds": 0.0, "folds": [0.5, 0.5]},
        },
        "not_pooled": {"val/f1": "not a mean over samples"},
    }
    assert summary_lines(summary) == [
        "Cross-validation over 2 folds (best epoch of each fold, monitor min val/loss):",
        "  val/loss             pooled 0.4500   mean over folds 0.5000 +- 0.2500  "
        "(folds: 0.2500 0.7500)",
        "  val/f1               pooled n/a      mean over folds 0.5000 +- 0.0000  "
        "(folds: 0.5000 0.5000)",
        "  not pooled over samples, mean over folds only: val/f1 (not a mean over samples)",
    ]


def write_results(
    run_dir: Path, fold_metrics: list[dict], entries: list, fold_sums: list[dict] | None = None
) -> None:
    """fold-<i>/result.json as write_fold_result writes it, for these metrics of each fold
    (and the sums of its StatefulMetrics, `fold_sums`; none: {})."""
    for fold, metrics in enumerate(fold_metrics):
        (run_dir / f"fold-{fold}").mkdir(parents=True, exist_ok=True)
        metrics = dict(metrics)  # the checkpoint has no val/num_samples: the result has it
        num_val_samples = int(metrics.pop("val/num_samples"))
        result = {"fold": fold, "checkpoint": "model_best.pth", "epoch": 1, "metrics": metrics,
                  "num_val_samples": num_val_samples,
                  "sample_means": folds_module.sample_mean_keys(sample_mean_names(entries), metrics),
                  "metric_sums": fold_sums[fold] if fold_sums else {}}  # fmt: skip
        (run_dir / f"fold-{fold}" / RESULT).write_text(json.dumps(result))


def fold_metrics(steps: list[StepOutput], metric_fns: dict, sums_out: list | None = None) -> dict:
    """A fold's validation metrics as the engine computes them from its batches; the sums of
    its StatefulMetrics (what its checkpoint keeps) are appended to `sums_out`."""
    sums = MetricSums(metric_fns, torch.device("cpu"))
    for step in steps:
        sums.add(step)
    result = sums.result("val")
    if sums_out is not None:
        sums_out.append(sums.stateful_sums)
    return result


def batches(num_samples: int, batch_size: int) -> list[slice]:
    return [slice(i, min(i + batch_size, num_samples)) for i in range(0, num_samples, batch_size)]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    num_folds=st.integers(2, 5),
    num_samples=st.integers(10, 60),
    num_classes=st.integers(4, 6),
    batch_size=st.integers(1, 9),
    seed=st.integers(0, 2**16),
)
def test_pooled_metrics_are_sklearns_on_the_concatenated_out_of_fold_predictions(
    tmp_path, num_folds, num_samples, num_classes, batch_size, seed
):
    """Folds a sample apart in size: the pooled loss, accuracy and top-k accuracy equal
    scikit-learn's over every fold's validation samples at once, whatever the batches."""
    sk_metrics = pytest.importorskip("sklearn.metrics")  # not in the floor environment
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_samples, num_classes, generator=generator, dtype=torch.float64)
    labels = torch.randint(num_classes, (num_samples,), generator=generator)
    # Fold i takes every num_folds-th sample from i: sizes differ by at most one.
    folds = [torch.arange(fold, num_samples, num_folds) for fold in range(num_folds)]
    metric_fns = {"accuracy": accuracy, "top_k_acc": top_k_acc}
    per_fold = []
    for indices in folds:
        output, target = logits[indices], labels[indices]
        steps = [
            StepOutput(F.cross_entropy(output[part], target[part]), output[part], target[part])
            for part in batches(len(indices), batch_size)
        ]
        per_fold.append(fold_metrics(steps, metric_fns))
    run_dir = tmp_path / f"run-{seed}-{num_folds}-{num_samples}-{batch_size}"
    write_results(run_dir, per_fold, list(metric_fns))
    summary = summarize_folds(run_dir, num_folds, ("max", "val/accuracy"))["metrics"]

    order = torch.cat(folds)  # the out-of-fold predictions, fold after fold
    output, target = logits[order].numpy(), labels[order].numpy()
    probabilities = torch.softmax(logits[order], dim=1).numpy()
    classes = list(range(num_classes))
    expected = {
        "val/accuracy": sk_metrics.accuracy_score(target, output.argmax(axis=1)),
        "val/top_k_acc": sk_metrics.top_k_accuracy_score(target, output, k=3, labels=classes),
        "val/loss": sk_metrics.log_loss(target, probabilities, labels=classes),
    }
    for key, value in expected.items():
        assert summary[key]["pooled"] == pytest.approx(value, rel=1e-9, abs=1e-12), key


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(num_folds=st.integers(2, 4), num_samples=st.integers(5, 40), seed=st.integers(0, 2**16))
def test_a_pooled_mse_or_mae_loss_is_sklearns(tmp_path, num_folds, num_samples, seed):
    sk_metrics = pytest.importorskip("sklearn.metrics")  # not in the floor environment
    generator = torch.Generator().manual_seed(seed)
    output = torch.randn(num_samples, generator=generator, dtype=torch.float64)
    target = torch.randn(num_samples, generator=generator, dtype=torch.float64)
    folds = [torch.arange(fold, num_samples, num_folds) for fold in range(num_folds)]
    order = torch.cat(folds)
    for name, loss, reference in [
        ("mse", F.mse_loss, sk_metrics.mean_squared_error),
        ("mae", F.l1_loss, sk_metrics.mean_absolute_error),
    ]:
        per_fold = [
            fold_metrics([StepOutput(loss(output[i], target[i]), None, target[i])], {})
            for i in folds
        ]
        run_dir = tmp_path / f"{name}-{seed}-{num_folds}-{num_samples}"
        write_results(run_dir, per_fold, [])
        pooled = summarize_folds(run_dir, num_folds, ("min", "val/loss"))["metrics"]["val/loss"]
        expected = reference(target[order].numpy(), output[order].numpy())
        assert pooled["pooled"] == pytest.approx(expected, rel=1e-9), name


def summarize_stateful(
    run_dir: Path, folds: list[torch.Tensor], output: torch.Tensor, target: torch.Tensor,
    metric_fns: dict, batch_size: int,
) -> dict:  # fmt: skip
    """The summary of folds whose validation scored `metric_fns` on output[i], target[i] for
    each fold's indices i, in batches of batch_size."""
    per_fold, fold_sums = [], []
    for indices in folds:
        steps = [
            StepOutput(torch.zeros(()), output[indices][part], target[indices][part])
            for part in batches(len(indices), batch_size)
        ]
        per_fold.append(fold_metrics(steps, metric_fns, fold_sums))
    write_results(run_dir, per_fold, [], fold_sums)
    return summarize_folds(run_dir, len(folds), ("min", "val/loss"), metric_fns)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    num_folds=st.integers(2, 5),
    num_samples=st.integers(10, 60),
    num_classes=st.integers(2, 6),
    num_outputs=st.integers(1, 3),
    batch_size=st.integers(1, 9),
    seed=st.integers(0, 2**16),
)
def test_pooled_f1_iou_r2_and_rmse_are_sklearns_on_the_out_of_fold_predictions(
    tmp_path, num_folds, num_samples, num_classes, num_outputs, batch_size, seed
):
    """Folds of uneven sizes: F1, MeanIoU, R2 and RMSE pooled from each fold's sums equal
    scikit-learn's on every fold's validation samples at once, whatever the batches."""
    sk_metrics = pytest.importorskip("sklearn.metrics")  # not in the floor environment
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_samples, num_classes, generator=generator)
    labels = torch.randint(num_classes, (num_samples,), generator=generator)
    output = torch.randn(num_samples, num_outputs, generator=generator)
    target = torch.randn(num_samples, num_outputs, generator=generator) * 3 + 1
    # Fold i takes every num_folds-th sample from i: sizes differ by at most one.
    folds = [torch.arange(fold, num_samples, num_folds) for fold in range(num_folds)]
    order = torch.cat(folds)  # the out-of-fold predictions, fold after fold
    run_dir = tmp_path / f"run-{seed}-{num_folds}-{num_samples}-{batch_size}"

    classes = {"f1": F1(num_classes), "iou": MeanIoU(num_classes, per_class=True)}
    summary = summarize_stateful(run_dir / "c", folds, logits, labels, classes, batch_size)
    predicted, truth = logits[order].argmax(dim=1).numpy(), labels[order].numpy()
    expected = {
        "val/f1": sk_metrics.f1_score(truth, predicted, average="macro"),
        "val/iou": sk_metrics.jaccard_score(truth, predicted, average="macro"),
    }
    present = set(truth) | set(predicted)
    per_class = sk_metrics.jaccard_score(truth, predicted, average=None, labels=sorted(present))
    expected |= {
        f"val/iou/{label}": value for label, value in zip(sorted(present), per_class, strict=True)
    }
    regression = {"r2": R2(num_outputs), "rmse": RMSE(num_outputs)}
    summary["metrics"] |= summarize_stateful(
        run_dir / "r", folds, output, target, regression, batch_size
    )["metrics"]
    y_true, y_pred = target[order].double().numpy(), output[order].double().numpy()
    expected["val/r2"] = sk_metrics.r2_score(y_true, y_pred)
    expected["val/rmse"] = sk_metrics.root_mean_squared_error(y_true, y_pred)
    for key, value in expected.items():
        assert summary["metrics"][key]["pooled"] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_pooled_f1_of_uneven_folds_is_the_f1_of_all_samples_not_the_folds_mean(tmp_path):
    """Fold 0 (3 samples) predicts all right, fold 1 (1 sample) all wrong: over the 4 samples
    F1 is sklearn's 0.4, where the folds' mean is 0.5 (1 and 0)."""
    logits = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    labels = torch.tensor([0, 1, 0, 1])
    folds = [torch.tensor([0, 1, 2]), torch.tensor([3])]
    summary = summarize_stateful(tmp_path, folds, logits, labels, {"f1": F1(2)}, batch_size=2)
    f1 = summary["metrics"]["val/f1"]
    assert f1["folds"] == [1.0, 0.0] and f1["mean_over_folds"] == 0.5
    # class 0: tp 2, fp 1, fn 0 -> 0.8; class 1: tp 1, fp 0, fn 1 -> 2/3; mean 11/15
    assert f1["pooled"] == pytest.approx((0.8 + 2 / 3) / 2)
    assert summary["not_pooled"] == {}


def test_sums_of_results_written_before_they_were_kept_are_named_not_pooled(tmp_path):
    """A fold finished before result.json kept the sums: F1 keeps its mean over folds, and
    one line says why it has no pooled value; the means over samples still pool."""
    logits, labels = torch.eye(2).repeat(2, 1), torch.tensor([0, 1, 1, 0])
    folds = [torch.tensor([0, 1]), torch.tensor([2, 3])]
    summarize_stateful(tmp_path, folds, logits, labels, {"f1": F1(2)}, batch_size=2)
    old = json.loads((tmp_path / "fold-0" / RESULT).read_text())
    del old["metric_sums"]
    (tmp_path / "fold-0" / RESULT).write_text(json.dumps(old))
    summary = summarize_folds(tmp_path, 2, ("min", "val/loss"), {"f1": F1(2)})
    why = f"fold 0's {RESULT} or checkpoint predates its sums"
    assert summary["not_pooled"] == {"val/f1": why}
    assert "pooled" in summary["metrics"]["val/loss"]
    assert summary_lines(summary)[-1] == (
        f"  not pooled over samples, mean over folds only: val/f1 ({why})"
    )


class OwnState:
    """A metric with torchmetrics' update/compute/reset: it keeps no sums in the engine's."""

    def update(self, output: torch.Tensor, target: torch.Tensor) -> None: ...

    def compute(self) -> torch.Tensor:
        return torch.tensor(0.5)

    def reset(self) -> None: ...


def test_a_metric_that_keeps_its_own_state_is_named_not_pooled_and_why(tmp_path):
    per_fold = [{"val/loss": 1.0, "val/auroc": 0.5, "val/num_samples": 3.0}] * 2
    write_results(tmp_path, per_fold, [])
    summary = summarize_folds(tmp_path, 2, ("min", "val/loss"), {"auroc": OwnState()})
    assert summary["not_pooled"] == {
        "val/auroc": "keeps its own state (torchmetrics): a checkpoint has its value, no sums"
    }
    assert summary["metrics"]["val/auroc"]["mean_over_folds"] == 0.5


def test_the_pooled_accuracy_of_uneven_folds_is_not_the_mean_of_their_accuracies(tmp_path):
    """3, 3 and 2 samples, 1 + 1 + 1 right: 3/8 over all samples, where the folds' mean is 7/18."""
    per_fold = [
        {"val/loss": 1.0, "val/accuracy": 1 / 3, "val/num_samples": 3.0},
        {"val/loss": 1.0, "val/accuracy": 1 / 3, "val/num_samples": 3.0},
        {"val/loss": 4.0, "val/accuracy": 1 / 2, "val/num_samples": 2.0},
    ]
    write_results(tmp_path, per_fold, ["accuracy", "F1"])
    summary = summarize_folds(tmp_path, 3, ("max", "val/accuracy"))
    accuracy = summary["metrics"]["val/accuracy"]
    assert accuracy["pooled"] == pytest.approx(3 / 8)
    assert accuracy["mean_over_folds"] == pytest.approx(7 / 18)
    assert summary["metrics"]["val/loss"]["pooled"] == pytest.approx(14 / 8)


def test_the_means_over_samples_are_the_loss_and_the_function_metrics_by_their_names():
    entries = ["accuracy", {"type": "top_k_acc", "name": "top3", "args": {"k": 3}}, "F1"]
    metrics = dict.fromkeys(
        ["train/loss", "val/loss", "val/top3", "val/f1", "val/ema_loss", "val/ema_top3"], 0.5
    )
    keys = folds_module.sample_mean_keys(sample_mean_names(entries), metrics)
    assert keys == ["val/loss", "val/top3", "val/ema_loss", "val/ema_top3"]


def test_a_monitored_training_metric_is_not_pooled_by_the_validation_counts(tmp_path):
    """train/loss is a mean over the training samples, which num_val_samples does not count."""
    per_fold = [{"train/loss": 1.0, "val/loss": 2.0, "val/num_samples": 3.0}] * 2
    write_results(tmp_path, per_fold, [])
    summary = summarize_folds(tmp_path, 2, ("min", "train/loss"))
    assert summary["not_pooled"] == {"train/loss": "not a validation metric"}
    assert summary["metrics"]["train/loss"]["mean_over_folds"] == 1.0
    assert summary["metrics"]["val/loss"]["pooled"] == 2.0


def test_a_stateful_metric_and_results_from_before_pooling_are_named_not_pooled(tmp_path):
    """F1 is not a mean over samples; a result.json written before the summary pooled has no
    sample_means: both keep their mean over folds, and one line names them."""
    per_fold = [{"val/loss": 1.0, "val/f1": 0.5, "val/num_samples": 3.0}] * 2
    write_results(tmp_path, per_fold, ["F1"])
    summary = summarize_folds(tmp_path, 2, ("max", "val/f1"))
    assert summary["not_pooled"] == {"val/f1": "not a mean over samples"}
    assert summary["metrics"]["val/f1"]["mean_over_folds"] == 0.5
    assert summary["metrics"]["val/loss"]["pooled"] == 1.0

    old = json.loads((tmp_path / "fold-1" / RESULT).read_text())
    del old["sample_means"]
    (tmp_path / "fold-1" / RESULT).write_text(json.dumps(old))
    summary = summarize_folds(tmp_path, 2, ("max", "val/f1"))
    assert summary["not_pooled"] == {
        "val/f1": "not a mean over samples",  # fold 0 says so
        "val/loss": f"fold-1/{RESULT} predates pooling",
    }
    assert "pooled" not in summary["metrics"]["val/loss"]
    assert summary["metrics"]["val/loss"]["mean_over_folds"] == 1.0
    assert summary_lines(summary)[-1] == (
        "  not pooled over samples, mean over folds only: val/f1 (not a mean over samples); "
        f"val/loss (fold-1/{RESULT} predates pooling)"
    )


def test_each_fold_has_its_folder_inside_the_run(make_config, tmp_path):
    args = train.parse_args(["-c", str(make_config()), "--folds", "3", "--run-id", "cv"])
    parser = ConfigParser.from_args(args)
    assert (parser.num_folds, parser.fold) == (3, None)
    assert parser.checkpoint_dir == parser.run_checkpoint_dir == tmp_path / "saved" / RUN / "cv"
    fold = parser.for_fold(2)
    assert fold.checkpoint_dir == parser.run_checkpoint_dir / "fold-2"
    assert fold.log_dir == tmp_path / "saved" / "log" / "Demo_CifarCNN" / "cv" / "fold-2"
    assert fold.config["data_loader"]["args"]["fold"] == 2
    assert parser.fold is None  # for_fold made a copy


# make_config's file and caplog (cleared) serve every example alike.
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.integers(2, 6).flatmap(lambda k: st.tuples(st.just(k), st.sets(st.integers(0, k - 1)))))
def test_a_fold_that_leaves_others_without_a_result_names_them_and_how_to_train_them(
    make_config, tmp_path_factory, caplog, folds_done
):
    """A resumed fold (-r fold-<i>/) trains that fold alone: nothing else starts the folds
    that have no result, so the log line names them and the command that trains them."""
    num_folds, finished = folds_done
    save_dir = tmp_path_factory.mktemp("saved")
    args = ["-c", str(make_config()), "--folds", str(num_folds), "--run-id", "cv"]
    args += ["--fold", "0", "--set", f"trainer.save_dir={save_dir}"]
    config = ConfigParser.from_args(train.parse_args(args))
    run_dir = config.run_checkpoint_dir
    for fold in finished | {0}:
        (run_dir / f"fold-{fold}").mkdir(parents=True, exist_ok=True)
        (run_dir / f"fold-{fold}" / RESULT).write_text("{}")
    missing = sorted(set(range(num_folds)) - finished - {0})

    def trained(fold_config, info, device, finish):  # fold 0 finished, with its result
        return None

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="train"):
        summary = folds_module.cross_validate(config, ProcessInfo(), torch.device("cpu"), trained)
    if not missing:
        return  # every fold has a result: the real finish_fold writes the summary
    assert summary is None
    assert caplog.messages[-1] == (
        f"Fold 0 finished; {SUMMARY} follows when every fold (0 to {num_folds - 1}) has. "
        f"Without a result yet: fold {', '.join(map(str, missing))}; train each with --folds "
        f"{num_folds} --fold <i> --run-id cv (one that has started: -r {run_dir / 'fold-<i>'})"
    )


def is_locked(folder: Path) -> bool:
    """folder/.lock is held by a process training there: an exclusive flock of our own, on a
    new open file (flock is per open file, so this process's own hold counts too), fails."""
    with open(folder / ".lock", "a") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(file, fcntl.LOCK_UN)
        return False


def test_fold_results_and_the_summary_are_written_while_the_folders_are_locked(
    make_config, tmp_path, monkeypatch
):
    """Until a fold's result.json and the run's folds_summary.json are written, no other
    process may take fold-<i>/ or the run folder (a second start would race those writes)."""
    seen = {}
    write = folds_module.write_text_atomic

    def checked_write(path: Path, text: str) -> None:
        seen[path.relative_to(tmp_path / "saved" / RUN / "cv")] = is_locked(path.parent)
        write(path, text)

    monkeypatch.setattr(folds_module, "write_text_atomic", checked_write)
    config = make_config(**{"trainer.epochs": 1, "trainer.tensorboard": False})
    assert train.main(["-c", str(config), "--folds", "2", "--run-id", "cv"]) == 0
    expected = {Path("fold-0") / RESULT: True, Path("fold-1") / RESULT: True, Path(SUMMARY): True}
    assert seen == expected
    run_dir = tmp_path / "saved" / RUN / "cv"
    assert not any(run_dir.rglob(".lock"))  # and the lock files went with the run


def test_train_py_keeps_each_folds_f1_sums_and_pools_them(make_config, tmp_path):
    """The sums of F1 that each fold's result.json keeps are its best epoch's (they give its
    val/F1, and the averaged weights' val/ema_F1), and the summary's pooled F1 is F1 of their
    total."""
    entries = ["accuracy", {"type": "F1", "args": {"num_classes": 10}}]
    overrides = {"trainer.epochs": 2, "trainer.tensorboard": False, "metrics": entries,
                 "trainer.ema_decay": 0.9}  # fmt: skip
    config = make_config(**overrides)
    assert train.main(["-c", str(config), "--folds", "2", "--run-id", "cv"]) == 0
    run_dir = tmp_path / "saved" / RUN / "cv"
    results = [json.loads((run_dir / f"fold-{i}" / RESULT).read_text()) for i in range(2)]
    summary = json.loads((run_dir / SUMMARY).read_text())
    assert summary["not_pooled"] == {}
    for key in ("val/F1", "val/ema_F1"):
        for result in results:
            assert F1(10).compute(result["metric_sums"][key]) == result["metrics"][key]
        fold_sums = [result["metric_sums"][key] for result in results]
        totals = [sum(sums) for sums in zip(*fold_sums, strict=True)]
        assert summary["metrics"][key]["pooled"] == pytest.approx(F1(10).compute(totals))


def test_a_cross_validation_run_again_names_the_command_that_continues_every_fold(
    make_config, tmp_path, capsys
):
    """The same command again: the error names auto_resume, which continues every fold, not
    -r <run>/fold-0, which would resume fold 0 alone; and that command does continue it."""
    config = make_config(**{"trainer.epochs": 1, "trainer.tensorboard": False})
    command = ["-c", str(config), "--folds", "2", "--run-id", "cv"]
    assert train.main(command) == 0
    run_dir = tmp_path / "saved" / RUN / "cv"
    summary = (run_dir / SUMMARY).read_text()
    capsys.readouterr()
    assert train.main(command) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: {run_dir}: this cross-validation already exists; continue it with this "
        "command and --set trainer.auto_resume=true, or choose another --run-id"
    )
    assert train.main([*command, "--set", "trainer.auto_resume=true"]) == 0
    assert (run_dir / SUMMARY).read_text() == summary


def test_a_fold_whose_checkpoint_predates_the_sums_leaves_its_f1_not_pooled(make_config, tmp_path):
    """A fold trained before checkpoints kept metric_sums, finished by a resume after: its
    result.json has none, so F1 is named not pooled (one line why) rather than pooled from
    {} or refused; the loss still pools."""
    entries = ["accuracy", {"type": "F1", "args": {"num_classes": 10}}]
    overrides = {"trainer.epochs": 1, "trainer.tensorboard": False, "metrics": entries}
    assert train.main(["-c", str(make_config(**overrides)), "--folds", "2", "--run-id", "cv"]) == 0
    run_dir = tmp_path / "saved" / RUN / "cv"
    best = run_dir / "fold-0" / "model_best.pth"
    state = torch.load(best, weights_only=True)
    del state["metric_sums"]
    torch.save(state, best)
    (run_dir / "fold-0" / RESULT).unlink()
    assert train.main(["-r", str(run_dir / "fold-0" / "checkpoint-epoch1.pth")]) == 0
    assert "metric_sums" not in json.loads((run_dir / "fold-0" / RESULT).read_text())
    summary = json.loads((run_dir / SUMMARY).read_text())
    assert summary["not_pooled"] == {"val/F1": f"fold 0's {RESULT} or checkpoint predates its sums"}
    assert "pooled" in summary["metrics"]["val/loss"]

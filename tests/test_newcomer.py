"""A newcomer's first hour (issue 23): typos and shape mistakes in one line before anything is
written, metrics that are not per-sample sums (equal to scikit-learn's), a task that is not
images trained, tested, predicted and exported, progress a pipe can read, fast defaults.

The entry scripts run in-process (their main(), or conftest's run_main for what they print):
what is checked is what they write and print. torchrun and gpu_check.sh are real processes."""

import csv
import itertools
import json
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, run_main, shrink
from test_distributed import run_torchrun
from torch.utils.data import TensorDataset

import data_loader.data_loaders as data_module
import train
from base import BaseDataLoader
from model.metric import F1, R2, RMSE
from utils.evaluation.metric_sums import MetricSums, StepOutput

RUN = Path("models") / "Demo_CifarCNN"


def demo(tmp_path: Path, **sections: dict) -> Path:
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    for name, values in sections.items():
        config[name] = {**config[name], **values} if isinstance(values, dict) else values
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def tabular(tmp_path: Path, name: str = "configs/tabular.json", **sections: dict) -> Path:
    config = json.loads((ROOT / name).read_text())
    config["trainer"].update(save_dir=str(tmp_path / "saved"), epochs=2)
    for section, values in sections.items():
        config[section] = {**config[section], **values} if isinstance(values, dict) else values
    path = tmp_path / "tabular.json"
    path.write_text(json.dumps(config))
    return path


def one_line_error(capsys: pytest.CaptureFixture, code: int) -> str:
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


# --- 1. typos in data_loader.args and trainer.args ----------------------------------------------


@pytest.mark.parametrize(
    ("section", "typo", "closest"),
    [
        ("data_loader", "validaton_split", "validation_split"),
        ("data_loader", "batchsize", "batch_size"),
        ("trainer", "stop_at_stp", "stop_at_step"),
    ],
)
def test_a_misspelt_key_names_the_known_ones_and_the_closest(
    stop_at, tmp_path, capsys, section, typo, closest
):
    config = json.loads(demo(tmp_path).read_text())
    if section == "trainer":
        config["trainer"]["type"] = "StopAt"
    config[section].setdefault("args", {})[typo] = 1
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(config))
    err = one_line_error(capsys, train.main(["-c", str(path)]))
    assert f"{section}.args: unknown key {typo!r} for " in err
    assert f"did you mean {closest!r}?" in err and "known: " in err
    assert not (tmp_path / "saved").exists()


def test_a_loader_that_does_not_pass_on_kwargs_is_told_so(tmp_path, capsys, monkeypatch):
    class RigidLoader(data_module.SyntheticDataLoader):
        def __init__(self, *, batch_size: int) -> None:  # forgot **kwargs
            super().__init__(batch_size=batch_size, seed=0)

    monkeypatch.setattr(data_module, "RigidLoader", RigidLoader, raising=False)
    monkeypatch.setattr(data_module, "__all__", [*data_module.__all__, "RigidLoader"])
    config = demo(tmp_path, data_loader={"type": "RigidLoader", "args": {"batch_size": 8}})
    err = one_line_error(capsys, train.main(["-c", str(config)]))
    assert "data_loader.type: RigidLoader.__init__ does not take seed, rank, num_replicas" in err
    assert "give it **kwargs and pass them on, super().__init__(**kwargs)" in err


# --- 2. the first batch, checked before anything is written ------------------------------------


class RowsLoader(BaseDataLoader):
    """16 features a row; its targets as a test asks (dtype, shape)."""

    splits = ("train",)

    def __init__(self, *, dtype: str = "float32", target: str = "column", **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.dtype, self.target = getattr(torch, dtype), target

    def load_split(self, split: str) -> TensorDataset:
        inputs = torch.randn(64, 16, generator=torch.Generator().manual_seed(0)).to(self.dtype)
        values = inputs.sum(dim=1).float()
        targets = {
            "column": values.unsqueeze(1),
            "flat": values,
            "float-labels": (values > 0).float(),
        }
        return TensorDataset(inputs, targets[self.target])

    def transform(self, augment: bool) -> object:
        return lambda values: values

    def class_names(self) -> list[str]:
        return ["no", "yes"] if self.target == "float-labels" else []


@pytest.mark.parametrize(
    ("loader_args", "model_args", "message"),
    [
        ({"target": "flat"}, {}, "mse_loss: the output (16, 1) and the target (16,) differ in shape"),
        ({"dtype": "float64"}, {}, "float64 data, where the model computes in float32"),
        ({"target": "float-labels"}, {"num_classes": 2},
         "a classifier's labels are class indices, int64 (B,); these are float32"),
        ({}, {"in_features": 7}, "in_features is 7, but the data has 16 features: set "
         "arch.args.in_features to 16"),
    ],
)  # fmt: skip
def test_data_that_does_not_fit_is_one_line_and_no_run_folder(
    tmp_path, capsys, monkeypatch, loader_args, model_args, message
):
    monkeypatch.setattr(data_module, "RowsLoader", RowsLoader, raising=False)
    monkeypatch.setattr(data_module, "__all__", [*data_module.__all__, "RowsLoader"])
    classifier = "num_classes" in model_args
    config = tabular(
        tmp_path,
        data_loader={"type": "RowsLoader", "args": {"batch_size": 16, **loader_args}},
        arch={"type": "TabularMLP", "args": {"in_features": 16, **model_args}},
        loss="cross_entropy" if classifier else "mse_loss",
        metrics=["accuracy"] if classifier else ["RMSE"],
        trainer={"epochs": 1, "monitor": "off", "save_dir": str(tmp_path / "saved")},
    )
    err = one_line_error(capsys, train.main(["-c", str(config)]))
    assert message in err
    assert not (tmp_path / "saved").exists()


def test_a_model_that_refuses_the_batch_is_named_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(data_module, "RowsLoader", RowsLoader, raising=False)
    monkeypatch.setattr(data_module, "__all__", [*data_module.__all__, "RowsLoader"])
    loader = {"type": "RowsLoader", "args": {"batch_size": 16}}
    config = demo(tmp_path, data_loader=loader, trainer={"monitor": "off"})  # CifarCNN, images
    err = one_line_error(capsys, train.main(["-c", str(config)]))
    assert "the first training batch ((16, 16) float32, (16, 1) float32) does not fit" in err
    assert not (tmp_path / "saved").exists()


# --- 4. metrics that are not per-sample sums ----------------------------------------------------


def sums_of(metric: object, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    sums = MetricSums({"m": metric}, torch.device("cpu"))
    for output, target in batches:
        sums.add(StepOutput(loss=torch.zeros(()), output=output, target=target))
    return sums.result("val")["val/m"]


def test_rmse_r2_and_f1_equal_scikit_learn_over_uneven_batches():
    metrics = pytest.importorskip("sklearn.metrics")
    generator = torch.Generator().manual_seed(0)
    target = torch.randn(101, 1, generator=generator) * 3 + 5
    output = target + torch.randn(101, 1, generator=generator)
    cuts = [0, 7, 40, 41, 101]  # batches of 7, 33, 1, 60
    pairs = [(output[a:b], target[a:b]) for a, b in itertools.pairwise(cuts)]
    expected_rmse = metrics.mean_squared_error(target, output) ** 0.5
    assert sums_of(RMSE(), pairs) == pytest.approx(expected_rmse, rel=1e-6)
    assert sums_of(R2(), pairs) == pytest.approx(metrics.r2_score(target, output), rel=1e-6)
    logits = torch.randn(101, 4, generator=generator)
    labels = torch.randint(0, 4, (101,), generator=generator)
    pairs = [(logits[a:b], labels[a:b]) for a, b in itertools.pairwise(cuts)]
    expected_f1 = metrics.f1_score(labels, logits.argmax(dim=1), average="macro")
    assert sums_of(F1(num_classes=4), pairs) == pytest.approx(expected_f1, rel=1e-9)


def test_torchmetrics_objects_keep_their_own_state_and_are_reset_each_epoch():
    regression = pytest.importorskip("torchmetrics.regression")
    classification = pytest.importorskip("torchmetrics.classification")
    generator = torch.Generator().manual_seed(1)
    target = torch.randn(101, 1, generator=generator)
    output = target + torch.randn(101, 1, generator=generator)
    cuts = [0, 7, 40, 41, 101]
    pairs = [(output[a:b], target[a:b]) for a, b in itertools.pairwise(cuts)]
    mse = regression.MeanSquaredError(squared=False)
    assert sums_of(mse, pairs) == pytest.approx(sums_of(RMSE(), pairs), rel=1e-6)
    # result() reset it: a second epoch over half the data is that half's value alone.
    assert sums_of(mse, pairs[:2]) == pytest.approx(sums_of(RMSE(), pairs[:2]), rel=1e-6)
    logits = torch.randn(101, 3, generator=generator)
    labels = torch.randint(0, 3, (101,), generator=generator)
    pairs = [(logits[a:b], labels[a:b]) for a, b in itertools.pairwise(cuts)]
    f1 = classification.MulticlassF1Score(num_classes=3, average="macro")
    assert sums_of(f1, pairs) == pytest.approx(sums_of(F1(num_classes=3), pairs), rel=1e-6)


def predictions(checkpoint: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(outputs, targets) of a checkpoint's model over a split of its own data, one process."""
    from build import load_inference_model

    model, config, _ = load_inference_model(checkpoint)
    data = data_module.TabularDataLoader(
        **{**config["data_loader"]["args"], "seed": config["seed"]}
    )
    loader = data.eval_loader(split)
    outputs, targets = [], []
    with torch.no_grad():
        for inputs, labels in loader:
            outputs.append(model(inputs))
            targets.append(labels)
    return torch.cat(outputs).numpy(), torch.cat(targets).numpy()


@pytest.mark.slow
@pytest.mark.parametrize("config_name", ["configs/tabular.json", "configs/wine.json"])
def test_distributed_metrics_equal_scikit_learn_on_the_same_predictions(tmp_path, config_name):
    metrics = pytest.importorskip("sklearn.metrics")
    config = tabular(tmp_path, config_name)
    result = run_torchrun(
        "--standalone", "--nproc_per_node=2", "train.py", "-c", str(config), "--run-id", "ddp"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    name = json.loads(config.read_text())["name"]
    checkpoint = tmp_path / "saved" / "models" / name / "ddp" / "checkpoint-epoch2.pth"
    logged = torch.load(checkpoint, weights_only=True)["metrics"]
    outputs, targets = predictions(checkpoint, "val")
    if "wine" in config_name:
        expected = metrics.f1_score(targets, outputs.argmax(axis=1), average="macro")
        assert logged["val/F1"] == pytest.approx(expected, rel=1e-9)
    else:
        expected_rmse = metrics.mean_squared_error(targets, outputs) ** 0.5
        assert logged["val/RMSE"] == pytest.approx(expected_rmse, rel=1e-5)
        assert logged["val/R2"] == pytest.approx(metrics.r2_score(targets, outputs), rel=1e-5)


# --- 5, 6. a task that is not images: trained, tested, predicted, exported ----------------------


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_the_tabular_example_beats_the_mean_and_predicts_and_exports(tmp_path):
    pytest.importorskip("sklearn")
    config = tabular(tmp_path, trainer={"epochs": 10})
    assert run_main("train.py", "-c", str(config), "--run-id", "t").returncode == 0
    best = tmp_path / "saved" / "models" / "Diabetes_MLP" / "t" / "model_best.pth"
    report = tmp_path / "test.json"
    tested = run_main("test.py", "-r", str(best), "--json", str(report))
    assert tested.returncode == 0, tested.stderr
    results = json.loads(report.read_text())["metrics"]
    # The mean predictor's R² on held-out rows is about 0 (its RMSE the targets' spread).
    _, targets = predictions(best, "test")
    assert results["test/R2"] > 0.25 and results["test/RMSE"] < targets.std() * 0.9
    # predict.py: CSV rows in, the model's values out.
    rows = torch.randn(3, 10, generator=torch.Generator().manual_seed(1)) * 0.05
    sheet = tmp_path / "rows.csv"
    with sheet.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"])
        writer.writerows(rows.tolist())
    out = tmp_path / "predictions.csv"
    predicted = run_main("predict.py", "-r", str(best), str(sheet), "--out", str(out))
    assert predicted.returncode == 0, predicted.stderr
    from build import load_inference_model

    model, _, _ = load_inference_model(best)
    with torch.no_grad():
        expected = model(rows).reshape(-1).tolist()
    written = [float(line.split(",")[1]) for line in out.read_text().splitlines()[1:]]
    assert written == pytest.approx(expected, rel=1e-5)
    exported = run_main("export.py", "-r", str(best), "--out", str(tmp_path / "tabular.pt2"))
    assert exported.returncode == 0, exported.stderr
    assert "inputs (10,)" in exported.stdout


def test_predict_and_export_refuse_data_that_says_nothing_of_its_inputs_in_one_line(tmp_path):
    from model.model import DenoisingCNN

    config = json.loads((ROOT / "configs/denoise.json").read_text())
    model = DenoisingCNN(**config["arch"]["args"])
    torch.save({"model": model.state_dict(), "config": config, "epoch": 1}, tmp_path / "d.pth")
    result = run_main("export.py", "-r", str(tmp_path / "d.pth"), "--out", str(tmp_path / "x.pt2"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "read_inputs(path, args, feature_names) and example_inputs(args, model, batch_size)" in (
        result.stderr
    )


# --- 7. progress a pipe can read -----------------------------------------------------------------


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_without_a_terminal_progress_comes_as_short_lines(tmp_path):
    config = demo(tmp_path, trainer={"progress_seconds": 0, "log_step": 2, "epochs": 1})
    result = run_main("train.py", "-c", str(config), "--run-id", "piped")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "  batch " in line]
    assert lines and lines[0].startswith("epoch 1/1  batch 2/8  loss ")
    assert lines[0].endswith("samples/s") and len(lines[0]) < 80
    summary = [line for line in result.stdout.splitlines() if line.startswith("CifarCNN: ")]
    assert summary and "parameters" in summary[0] and "Conv2d(" not in result.stdout
    epoch = [line for line in result.stdout.splitlines() if line.startswith("epoch 1/1  train")]
    assert epoch and len(epoch[0]) < 200


# --- 8, 10. schedules that follow --epochs, fast defaults ----------------------------------------


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_the_demo_schedule_follows_epochs(tmp_path):
    config = demo(tmp_path, trainer={"epochs": 5, "tensorboard": False})
    result = run_main("train.py", "-c", str(config), "--run-id", "five")
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "saved" / RUN / "five"
    rates = [torch.load(run_dir / f"checkpoint-epoch{e}.pth", weights_only=True)["metrics"]["lr"]
             for e in range(1, 6)]  # fmt: skip
    assert all(later < earlier for earlier, later in itertools.pairwise(rates))
    assert rates[-1] > 0  # the cosine reaches 0 after the last epoch, not inside the run
    assert "ends after" not in result.stdout  # no warning: the length is derived


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_workers_persist_by_default_and_a_mid_epoch_resume_with_them_is_exact(stop_at, tmp_path):
    loader = data_module.SyntheticDataLoader(batch_size=8, seed=0, num_workers=2, num_train=64)
    assert loader.persistent_workers
    config = json.loads(demo(tmp_path).read_text())
    config["data_loader"]["args"]["num_workers"] = 2  # augmentation in worker processes
    config["trainer"].update(epochs=2, deterministic=True, type="StopAt", tensorboard=False)
    path = tmp_path / "workers.json"
    path.write_text(json.dumps(config))
    assert train.main(["-c", str(path), "--run-id", "straight"]) == 0
    stop = ["--set", "trainer.args.stop_at_step=11"]  # 3 batches into epoch 2
    assert train.main(["-c", str(path), "--run-id", "stopped", *stop]) == 128 + signal.SIGTERM
    run_dir = tmp_path / "saved" / RUN / "stopped"
    assert train.main(["-r", str(run_dir), "--set", "trainer.args.stop_at_step=0"]) == 0
    a = torch.load(
        tmp_path / "saved" / RUN / "straight" / "checkpoint-epoch2.pth", weights_only=True
    )
    b = torch.load(run_dir / "checkpoint-epoch2.pth", weights_only=True)
    assert all(torch.equal(a["model"][key], b["model"][key]) for key in a["model"])
    assert a["metrics"]["train/loss"] == b["metrics"]["train/loss"]


# --- 11. the smaller items -----------------------------------------------------------------------


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_regression_runs_say_no_classes_refuse_a_confusion_image_early_and_cross_validate(tmp_path):
    pytest.importorskip("sklearn")
    config = tabular(tmp_path)
    result = run_main("train.py", "-c", str(config), "--run-id", "r", "--folds", "3")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "validation samples, no classes;" in result.stdout
    assert "Cross-validation over 3 folds" in result.stdout
    best = tmp_path / "saved" / "models" / "Diabetes_MLP" / "r" / "fold-0" / "model_best.pth"
    refused = run_main("test.py", "-r", str(best), "--confusion-png", str(tmp_path / "c.png"))
    assert refused.returncode == 2 and "the data has no classes" in refused.stderr
    assert " samples, " not in refused.stdout  # refused before the evaluation


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_gpu_check_stops_at_once_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: gpu_check.sh runs")
    result = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True,
        timeout=300, env={**os.environ, "OUT": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        result.stderr.startswith("error: no python here sees CUDA")
        and result.stderr.count("\n") == 1
    )
    assert "preflight\tfail" in (tmp_path / "summary.tsv").read_text()  # kept, as on a GPU

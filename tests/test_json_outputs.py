"""Every JSON file the project writes is strict JSON (RFC 8259), whatever the metrics: a NaN or
infinite number is written as null (utils.util.json_text, docs/outputs.md), so that jq,
JavaScript's JSON.parse, Go and the project's own read_json read it; and a fold summary over
such values is still written."""

import json
import math
import statistics
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import ENTRY_POINTS, run_main
from hypothesis import given, settings
from hypothesis import strategies as st

import model.model
from sweeps.results import write_json, write_record, write_summary
from sweeps.space import Trial
from utils.evaluation.predictions import format_rows
from utils.state.checkpoint import save_checkpoint
from utils.state.folds import RESULT, finish_fold, summarize_folds
from utils.state.run_folder import SUMMARY

NONFINITE = st.sampled_from([math.nan, math.inf, -math.inf])
VALUES = st.floats(-1e6, 1e6) | NONFINITE
METRICS = st.dictionaries(st.sampled_from(["val/loss", "val/accuracy", "loss"]), VALUES, min_size=1)


def strict_loads(text: str) -> object:
    """json.loads as a strict reader: NaN, Infinity and -Infinity are not JSON."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def as_written(value: float) -> float | None:
    return value if math.isfinite(value) else None


@settings(max_examples=30, deadline=None)
@given(folds=st.lists(VALUES, min_size=2, max_size=5))
def test_a_fold_summary_over_nonfinite_values_is_numpys_mean_and_std(tmp_path_factory, folds):
    """A fold whose metric is NaN or inf (a run that diverged) still gets a summary: the mean
    and the sample standard deviation are numpy's, the spread unknown (nan) where a value is."""
    run_dir = tmp_path_factory.mktemp("run")
    for fold, value in enumerate(folds):
        (run_dir / f"fold-{fold}").mkdir()
        result = {"fold": fold, "checkpoint": "model_best.pth", "epoch": 1}
        # Python's json, as earlier versions wrote result.json: NaN and Infinity literals.
        text = json.dumps({**result, "metrics": {"val/loss": value}})
        (run_dir / f"fold-{fold}" / RESULT).write_text(text)
    summary = summarize_folds(run_dir, len(folds), ("min", "val/loss"))
    metric = summary["metrics"]["val/loss"]
    with np.errstate(all="ignore"):  # inf - inf in numpy's spread: nan, as expected
        mean, std = np.mean(folds), np.std(folds, ddof=1)
    assert metric["mean_over_folds"] == pytest.approx(mean, nan_ok=True)
    if all(map(math.isfinite, folds)):
        # numpy rounds (1e-10 for equal folds of 7e5), statistics.stdev is exact.
        assert metric["std_over_folds"] == pytest.approx(statistics.stdev(folds))
        assert metric["std_over_folds"] == pytest.approx(
            std, abs=1e-12 * max(map(abs, folds)) + 1e-12
        )
    else:
        assert math.isnan(metric["std_over_folds"])


def test_a_fold_with_a_nan_metric_is_summarized_not_a_traceback(tmp_path):
    """The exact case: statistics.stdev raised AttributeError on a nan."""
    for fold, value in enumerate([0.5, math.nan]):
        (tmp_path / f"fold-{fold}").mkdir()
        result = {"fold": fold, "checkpoint": "model_best.pth", "epoch": 1}
        text = json.dumps({**result, "metrics": {"val/loss": value}})
        (tmp_path / f"fold-{fold}" / RESULT).write_text(text)
    metric = summarize_folds(tmp_path, 2, ("min", "val/loss"))["metrics"]["val/loss"]
    assert math.isnan(metric["mean_over_folds"]) and math.isnan(metric["std_over_folds"])


def write_every_json(folder: Path, metrics: dict[str, float]) -> dict[str, Path]:
    """Each JSON writer of train.py, test.py and predict.py, given `metrics`: the files, by who
    writes them (the sweep's files: test_every_sweep_file_is_strict_json)."""
    files = {"test.py --json": folder / "report.json", "predict.py --out": folder / "rows.json"}
    ENTRY_POINTS["test"].write_outputs({"--json": files["test.py --json"]}, dict(metrics), None)
    rows = [{"path": "image.png", **metrics}]
    files["predict.py --out"].write_text(format_rows(rows, ".json"), encoding="utf-8")
    # train.py with data_loader.args.folds: each fold's result.json, then folds_summary.json.
    run_dir = folder / "run"
    for fold in range(2):
        checkpoint_dir = run_dir / f"fold-{fold}"
        checkpoint_dir.mkdir(parents=True)
        state = {"model": {}, "config": {}, "epoch": 1, "metrics": metrics}
        save_checkpoint(state, checkpoint_dir / "model_best.pth")
        config = SimpleNamespace(
            checkpoint_dir=checkpoint_dir, fold=fold, num_folds=2, run_checkpoint_dir=run_dir
        )
        config.monitor_mode, config.monitor_key = "min", "val/loss"
        finish_fold(config, 3 + fold, {"loss", "accuracy"})
    files |= {"result.json": run_dir / "fold-0" / RESULT, SUMMARY: run_dir / SUMMARY}
    return files


@settings(max_examples=30, deadline=None)
@given(metrics=METRICS)
def test_every_json_file_written_is_strict_json_whatever_the_metrics(tmp_path_factory, metrics):
    """A NaN or inf anywhere (a diverged run's loss) is null; a finite value is kept exactly."""
    files = write_every_json(tmp_path_factory.mktemp("outputs"), metrics)
    for who, path in files.items():
        try:
            strict_loads(path.read_text(encoding="utf-8"))
        except ValueError as error:
            pytest.fail(f"{who} ({path.name}) is not strict JSON: {error}")
    report = strict_loads(files["test.py --json"].read_text())
    assert report == {key: as_written(value) for key, value in metrics.items()}
    row = strict_loads(files["predict.py --out"].read_text())[0]
    assert row == {
        "path": "image.png",
        **{key: as_written(value) for key, value in metrics.items()},
    }
    result = strict_loads(files["result.json"].read_text())
    assert result["metrics"] == {key: as_written(value) for key, value in metrics.items()}


def test_a_nan_loss_in_test_reports_is_null(tmp_path):
    """The exact case: test.py --json of a model whose loss is nan wrote `NaN`, not JSON."""
    path = tmp_path / "report.json"
    ENTRY_POINTS["test"].write_outputs({"--json": path}, {"loss": math.nan, "n": 3}, None)
    assert strict_loads(path.read_text()) == {"loss": None, "n": 3}


def test_test_py_of_a_diverged_model_writes_strict_json(demo_checkpoint, tmp_path, monkeypatch):
    """End to end: a model whose outputs are NaN (its weights diverged) gives a NaN loss; test.py
    --json still writes JSON that a strict reader takes, the loss as null."""

    def diverged(self, images):  # (B, 10) logits, all NaN
        return torch.full((images.shape[0], 10), math.nan)

    monkeypatch.setattr(model.model.CifarCNN, "forward", diverged)
    path = tmp_path / "report.json"
    tested = run_main("test", "-r", str(demo_checkpoint), "--json", str(path))
    assert tested.returncode == 0, tested.stderr[-2000:]
    report = strict_loads(path.read_text(encoding="utf-8"))
    assert report["metrics"]["test/loss"] is None, report


@settings(max_examples=30, deadline=None)
@given(metrics=METRICS)
def test_every_sweep_file_is_strict_json_whatever_the_metrics(tmp_path_factory, metrics):
    """sweep.py's sweep.json (its trials' values), a trial's record and the summary, with a
    NaN or inf as a trial's value and score."""
    folder = tmp_path_factory.mktemp("sweep")
    value = next(iter(metrics.values()))
    trial = Trial(0, {"optimizer.args.lr": value})
    write_json(folder / "sweep.json", {"trials": [{"values": trial.values}]})
    (folder / "trials").mkdir()
    write_record(folder, trial, status="finished", code=0, run_dir=folder)
    row = {"rank": None, "trial": trial.name, "status": "finished", "value": value}
    row |= {"epoch": 1, "values": trial.values, "run_dir": str(folder)}
    write_summary(folder, [row], monitor="min val/loss", key="val/loss")
    for path in (folder / "sweep.json", folder / "sweep_summary.json", *folder.glob("trials/*")):
        try:
            strict_loads(path.read_text(encoding="utf-8"))
        except ValueError as error:
            pytest.fail(f"{path.name} is not strict JSON: {error}")

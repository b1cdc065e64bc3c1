"""Metrics named in config: one type twice under other names and arguments, per-class values
logged and shown by test.py, and the names that cannot work refused in one line."""

import copy
import csv
import json
import math

import pytest
import torch
from conftest import checkpoint_dirs, run_main
from test_distributed import run_torchrun

from data_loader.synthetic import CLASS_NAMES
from utils.config.load_config import validate
from utils.util import ConfigError

# Two MeanIoUs (every class, and all but class 0 with that class's samples left out) and a
# PixelAccuracy, on the demo's 10 classes: for logits (B, C) against labels (B,) the pixel
# accuracy is the accuracy.
METRICS = [
    "accuracy",
    {"type": "MeanIoU", "name": "iou", "args": {"num_classes": 10, "per_class": True}},
    {"type": "MeanIoU", "name": "iou_no_0", "args": {"num_classes": 10, "ignore_index": 0}},
    {"type": "PixelAccuracy", "args": {"num_classes": 10}},
]


@pytest.fixture
def demo_config(make_config) -> dict:
    """The shrunk demo config, as a dict."""
    return json.loads(make_config().read_text())


def test_one_metric_twice_with_other_args_trains_logs_and_tests_both(make_config, tmp_path):
    """Each entry its own key (val/iou, val/iou_no_0), the monitor naming one of them; the
    per-class values under val/iou/<class name> (the data's names), in metrics.csv, in test.py's
    JSON and in a table of its output."""
    config = make_config(
        **{
            "metrics": METRICS,
            "trainer.monitor": "max val/iou_no_0",
            "trainer.epochs": 1,
            "trainer.loggers": ["csv"],
            "data_loader.args.num_train": 96,
            "data_loader.args.num_test": 32,
        }
    )
    trained = run_main("train", "-c", str(config), "--run-id", "run")
    assert trained.returncode == 0, trained.stderr
    (run_dir,) = checkpoint_dirs(tmp_path / "saved")
    log_dir = tmp_path / "saved" / "log" / run_dir.relative_to(tmp_path / "saved" / "models")
    with (log_dir / "metrics.csv").open() as file:
        (row,) = [row for row in csv.DictReader(file) if row.get("val/iou")]
    per_class = [f"val/iou/{name}" for name in CLASS_NAMES]
    assert set(per_class) <= set(row) and "val/iou_no_0/disk" not in row
    values = {key: float(row[key]) for key in ["val/iou", "val/iou_no_0", *per_class]}
    present = [values[key] for key in per_class if not math.isnan(values[key])]
    assert values["val/iou"] == pytest.approx(sum(present) / len(present), rel=1e-9)
    assert float(row["val/PixelAccuracy"]) == pytest.approx(float(row["val/accuracy"]), rel=1e-12)
    assert "val/iou/" not in trained.stderr + trained.stdout  # not in the epoch's line

    results_path = tmp_path / "results.json"
    tested = run_main("test", "-r", str(run_dir / "model_best.pth"), "--json", str(results_path))
    assert tested.returncode == 0, tested.stderr
    metrics = json.loads(results_path.read_text())["metrics"]
    assert {"test/iou", "test/iou_no_0", "test/PixelAccuracy"} <= set(metrics)
    assert {f"test/iou/{name}" for name in CLASS_NAMES} <= set(metrics)
    lines = [line.split() for line in (tested.stdout + tested.stderr).splitlines()]
    header = lines.index(["class", "iou"])  # a row per class, a column per metric's breakdown
    shown = {line[0]: line[1] for line in lines[header + 1 : header + 1 + len(CLASS_NAMES)]}
    values = {name: metrics[f"test/iou/{name}"] for name in CLASS_NAMES}
    assert shown == {  # null in the JSON: a class absent from the split (its IoU nan)
        name: "n/a" if value is None else f"{value:.4f}" for name, value in values.items()
    }


@pytest.mark.slow
def test_two_processes_log_what_one_process_computes(make_config, tmp_path):
    """A 2-process (gloo) run's validation, the counts summed over the ranks, equals test.py
    --split val on its checkpoint in one process: the means and every per-class value."""
    overrides = {"metrics": METRICS, "trainer.monitor": "max val/iou_no_0", "trainer.epochs": 1}
    config = make_config(**overrides, **{"data_loader.args.num_train": 200})  # 40 to validate
    command = ["--standalone", "--nproc_per_node=2", "train.py", "-c", str(config)]
    trained = run_torchrun(*command, "--run-id", "ddp")
    assert trained.returncode == 0, trained.stderr[-3000:]
    checkpoint = tmp_path / "saved" / "models" / "Demo_CifarCNN" / "ddp" / "checkpoint-epoch1.pth"
    logged = torch.load(checkpoint, weights_only=True)["metrics"]
    results_path = tmp_path / "val.json"
    tested = run_main("test", "-r", str(checkpoint), "--split", "val", "--json", str(results_path))
    assert tested.returncode == 0, tested.stderr
    one_process = json.loads(results_path.read_text())["metrics"]
    keys = ["val/iou", "val/iou_no_0", "val/PixelAccuracy"]
    keys += [f"val/iou/{name}" for name in CLASS_NAMES]
    written = [math.nan if one_process[key] is None else one_process[key] for key in keys]
    assert [logged[key] for key in keys] == pytest.approx(written, rel=1e-9, nan_ok=True)


def test_a_metric_config_naming_a_class_count_the_data_does_not_have_is_refused(
    make_config, tmp_path
):
    """MeanIoU of 3 classes on data that names 10: one line naming the entry, nothing written."""
    metrics = [{"type": "MeanIoU", "args": {"num_classes": 3}}]
    config = make_config(**{"metrics": metrics, "trainer.monitor": "off"})
    result = run_main("train", "-c", str(config))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "config.json: metrics[0].args: num_classes is 3 but class_names" in line
    assert "has 10: disk, square" in line and not (tmp_path / "saved").exists()


@pytest.mark.parametrize(
    ("metrics", "monitor", "message"),
    [
        ([*METRICS, {"type": "MeanIoU", "name": "iou", "args": {"num_classes": 4}}],
         "max val/iou", r'metrics\[4\]: a second metric named "iou" \(val/iou\); give each entry'),
        (["accuracy", {"type": "accuracy"}], "off", r'metrics\[1\]: a second metric named '
         r'"accuracy"'),
        ([{"type": "MeanIoU", "name": "loss", "args": {"num_classes": 4}}], "off",
         r"metrics: must be .* not \"loss\""),
        ([{"type": "MeanIoU", "name": "iou/all", "args": {"num_classes": 4}}], "off",
         r"metrics: must be .* letters, digits and \"_\""),
        ([{"type": "MeanIoU", "name": "ema_iou", "args": {"num_classes": 4}}], "off",
         r"metrics: must be .*\"ema_\.\.\.\""),
        (METRICS, "max val/MeanIoU", r'trainer.monitor: unknown metric "val/MeanIoU" \(choose '
         r"from .*val/iou, val/iou_no_0"),
    ],
)  # fmt: skip
def test_metric_names_that_cannot_work_are_refused_in_one_line(
    demo_config, metrics, monitor, message
):
    config = copy.deepcopy(demo_config)
    config["metrics"], config["trainer"]["monitor"] = metrics, monitor
    with pytest.raises(ConfigError, match=message) as error:
        validate(config, "cfg.json")
    assert "\n" not in str(error.value) and str(error.value).startswith("cfg.json: ")


def test_a_named_metric_can_be_monitored(demo_config):
    config = copy.deepcopy(demo_config)
    config["metrics"], config["trainer"]["monitor"] = METRICS, "max val/iou_no_0"
    assert validate(config, "cfg.json")["metrics"] == METRICS

"""trainer.loggers: the CSV files across resumes, the fan-out and a failing logger, samples/s
after a resume, the confusion matrix (its math, test.py's report and image), and W&B / MLflow
read back when installed."""

import contextlib
import csv
import importlib.machinery
import importlib.util
import json
import logging
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
from conftest import ENTRY_POINTS, ROOT, Crash, shrink
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import base.base_trainer
import base.intervals
import data_loader.data_loaders as data_module
import train
from base.intervals import Progress, epoch_speed, log_interval
from logger import ExperimentLogger, Loggers, TensorboardLogger, check_logger_packages
from logger.csv_logger import CsvLogger
from logger.tracking import SentSteps, TrackingLogger
from parse_config import ConfigError, ConfigParser
from utils import UserError
from utils.evaluation.confusion import ConfusionMatrix, class_scores, draw_confusion_matrix
from utils.evaluation.metric_sums import MetricSums, StepOutput

RUN = Path("models") / "Demo_CifarCNN"


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


def test_csv_logger_drops_the_rows_past_the_resume_point(tmp_path):
    def run(epochs: range, epochs_done: int, batches_done: int, first_batch: int) -> None:
        logger = CsvLogger(tmp_path, epochs_done, batches_done)
        for epoch in epochs:
            start = first_batch if epoch == epochs_done + 1 else 1
            for batch in range(start, 5):
                step = (epoch - 1) * 4 + batch
                logger.log_step({"train/step_loss": step / 10}, step=step, epoch=epoch, batch=batch)
            logger.log_epoch({"val/loss": epoch / 10}, step=epoch * 4, epoch=epoch)
        logger.close(finished=True)

    run(range(1, 4), 0, 0, 1)  # three epochs of four batches
    # A stop inside epoch 2 left a later epoch behind (a resume from an earlier checkpoint),
    # and a crash cut the last line short.
    with (tmp_path / "steps.csv").open("a") as file:
        file.write("3,4,12,0.")
    run(range(2, 4), 1, 2, 3)  # resumed after batch 2 of epoch 2
    metrics, steps = read_csv(tmp_path / "metrics.csv"), read_csv(tmp_path / "steps.csv")
    assert [(row["epoch"], row["step"], row["val/loss"]) for row in metrics] == [
        ("1", "4", "0.1"),
        ("2", "8", "0.2"),
        ("3", "12", "0.3"),
    ]
    positions = [(int(row["epoch"]), int(row["batch"]), int(row["step"])) for row in steps]
    expected = [
        (epoch, batch, (epoch - 1) * 4 + batch) for epoch in (1, 2, 3) for batch in range(1, 5)
    ]
    assert positions == expected  # every step once, in order
    # A resume from the end of epoch 1 keeps epoch 1 only.
    CsvLogger(tmp_path, 1, 0).close(finished=True)
    assert [row["epoch"] for row in read_csv(tmp_path / "metrics.csv")] == ["1"]
    assert {row["epoch"] for row in read_csv(tmp_path / "steps.csv")} == {"1"}


def test_csv_logger_adds_a_new_key_as_a_column(tmp_path):
    logger = CsvLogger(tmp_path, 0, 0)
    logger.log_epoch({"val/loss": 0.5}, step=4, epoch=1)
    logger.log_epoch({"val/loss": 0.25, "val/ema_loss": 0.3}, step=8, epoch=2)
    logger.close(finished=True)
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines == ["epoch,step,val/loss,val/ema_loss", "1,4,0.5,", "2,8,0.25,0.3"]


@settings(max_examples=30, deadline=None)
@given(num_epochs=st.integers(1, 5), data=st.data())
def test_metrics_csv_cut_anywhere_by_a_crash_and_resumed_with_a_new_metric_reads_by_name(
    num_epochs, data
):
    """A crash may cut metrics.csv at any byte; the resume (from the epochs whose rows are
    whole) adds a row with a new metric: every row reads back by name with its own values, the
    cut row dropped, no value shifted under another column."""
    written = [{"val/loss": 1 / epoch, "lr": epoch / 8} for epoch in range(1, num_epochs + 1)]
    with tempfile.TemporaryDirectory() as folder:
        log_dir = Path(folder)
        logger = CsvLogger(log_dir, 0, 0)
        for epoch, metrics in enumerate(written, start=1):
            logger.log_epoch(metrics, step=epoch * 10, epoch=epoch)
        logger.close(finished=True)
        text = (log_dir / "metrics.csv").read_bytes()
        cut = data.draw(st.integers(0, len(text)))
        (log_dir / "metrics.csv").write_bytes(text[:cut])
        whole = max(text[:cut].count(b"\n") - 1, 0)  # rows ending in a newline, less the header
        logger = CsvLogger(log_dir, whole, 0)
        logger.log_epoch({"val/new": 7.0, "val/loss": 0.5}, step=99, epoch=whole + 1)
        logger.close(finished=True)
        rows = read_csv(log_dir / "metrics.csv")
    assert [int(row["epoch"]) for row in rows] == list(range(1, whole + 2))
    for row, metrics in zip(rows, written[:whole], strict=False):
        assert float(row["val/loss"]) == metrics["val/loss"] and float(row["lr"]) == metrics["lr"]
        assert row["val/new"] == ""
    assert (rows[-1]["val/new"], rows[-1]["val/loss"], rows[-1]["step"]) == ("7.0", "0.5", "99")


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_metrics_csv_holds_each_epoch_once_its_values_exact_under_their_own_keys(data):
    """Rows of changing keys (a metric only some epochs have), any float: read back, each row
    holds its own values, exactly (repr round-trips), and an empty cell for a key it lacked;
    after a resume from any earlier epoch, each epoch once, the resumed run's rows last."""
    value = st.floats(allow_nan=False)
    keys = ["val/loss", "val/ema_loss", "val/iou/cat", "time/mfu"]
    row = st.fixed_dictionaries({}, optional=dict.fromkeys(keys, value))
    epochs = data.draw(st.integers(1, 5))
    resume_at = data.draw(st.integers(0, epochs))  # the resumed checkpoint's epoch
    first = {epoch: (10 * epoch, data.draw(row)) for epoch in range(1, epochs + 1)}
    again = {epoch: (10 * epoch + 1, data.draw(row)) for epoch in range(resume_at + 1, epochs + 2)}
    with tempfile.TemporaryDirectory() as folder:
        for epochs_done, logged in ((0, first), (resume_at, again)):
            logger = CsvLogger(Path(folder), epochs_done, 0)
            for epoch, (step, metrics) in logged.items():
                logger.log_epoch(metrics, step=step, epoch=epoch)
            logger.close(finished=True)
        read = read_csv(Path(folder) / "metrics.csv")
    expected = {epoch: first[epoch] for epoch in range(1, resume_at + 1)} | again
    assert [int(row.pop("epoch")) for row in read] == list(expected)
    for cells, (step, metrics) in zip(read, expected.values(), strict=True):
        assert int(cells.pop("step")) == step
        assert {key: float(text) for key, text in cells.items() if text} == metrics


class SentRows(TrackingLogger):
    """A tracker that keeps what it is sent."""

    name = "tracker"

    def __init__(self, log_dir: Path, received: list) -> None:
        self.sent, self.received = SentSteps(log_dir, self.name, "run-1"), received

    def log_scalars(self, values: dict[str, float], step: int) -> None:
        self.received.append((step, int(values["epoch"]), int(values["batch"])))

    def close(self, *, finished: bool) -> None:
        pass


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 5), st.integers(1, 3), st.data())
@example(batches=4, accumulate=2, log_step=1, epochs=2, data=None)  # lost epoch 2's batch 1
def test_a_tracker_gets_every_row_once_across_a_crash_and_a_resume(
    batches, accumulate, log_step, epochs, data
):
    """The log_step rows of any accumulation and log_step (an epoch's first rows may share the
    step of the epoch before), sent by a part cut short after any row and a resume from any
    earlier row: the tracker gets each row once, in order."""
    rows, step = [], 0  # (global step after the batch, epoch, batch), as the loop logs them
    for epoch in range(1, epochs + 1):
        for batch in range(1, batches + 1):
            step += batch % accumulate == 0 or batch == batches  # an optimizer step
            if batch % log_step == 0 or batch == batches:
                rows.append((step, epoch, batch))
    crash = len(rows) if data is None else data.draw(st.integers(0, len(rows)))
    resume = 0 if data is None else data.draw(st.integers(0, crash))  # its checkpoint's row
    received = []
    with tempfile.TemporaryDirectory() as folder:
        for part in (rows[:crash], rows[resume:]):
            tracker = SentRows(Path(folder), received)
            for step, epoch, batch in part:
                values = {"epoch": epoch, "batch": batch}
                tracker.log_step(values, step=step, epoch=epoch, batch=batch)
    assert received == rows


class Recorder(ExperimentLogger):
    """Keeps every call; fails from its `fail_at`-th call on, as a full disk would."""

    def __init__(self, name: str, fail_at: int | None = None) -> None:
        self.name, self.fail_at, self.calls = name, fail_at, []

    def record(self, *call) -> None:
        if self.fail_at is not None and len(self.calls) + 1 >= self.fail_at:
            raise OSError(28, "No space left on device")
        self.calls.append(call)

    def log_step(self, values, *, step, epoch, batch):
        self.record("step", values, step, epoch, batch)

    def log_epoch(self, metrics, *, step, epoch):
        self.record("epoch", metrics, step, epoch)

    def close(self, *, finished):
        self.record("close", finished)


def test_every_logger_gets_the_same_values_and_a_failing_one_is_dropped_with_one_warning(caplog):
    first, failing, last = Recorder("first"), Recorder("failing", fail_at=2), Recorder("last")
    loggers = Loggers([first, failing, last], logging.getLogger("trainer"))
    with caplog.at_level(logging.WARNING):
        for step in (1, 2, 3):
            loggers.log_step({"train/step_loss": 1.0 / step}, step=step, epoch=1, batch=step)
        loggers.log_epoch({"val/loss": 0.5}, step=3, epoch=1)
        loggers.close(finished=True)
    expected = [("step", {"train/step_loss": 1.0 / step}, step, 1, step) for step in (1, 2, 3)]
    expected += [("epoch", {"val/loss": 0.5}, 3, 1), ("close", True)]
    assert first.calls == last.calls == expected
    assert failing.calls == expected[:1]
    warnings = [record.getMessage() for record in caplog.records]
    assert warnings == [
        "Logger failing failed (OSError: [Errno 28] No space left on device): it logs nothing "
        "more; training goes on."
    ]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 8), st.integers(1, 60), st.integers(1, 5))
@example(batch_size=32, num_samples=80, log_step=1)  # was 32 samples, not 16, at the last read
def test_step_flops_per_second_counts_the_samples_of_the_batches_read(
    batch_size, num_samples, log_step
):
    """time/step_flops_per_second at each log_step read is the FLOPs of the samples trained
    since the read before, per second: the last batch of the data counts its own samples."""
    sizes = [min(batch_size, num_samples - start) for start in range(0, num_samples, batch_size)]
    recorder, clock = Recorder("recorder"), SimpleNamespace(now=0.0)
    trainer = SimpleNamespace(
        options={"verbosity": 0, "progress_seconds": 0}, rank=0, epochs=1,
        stop=SimpleNamespace(signum=None), step_per_batch=False, flops_per_sample=10.0,
        train_loader=SimpleNamespace(batch_size=batch_size), data=SimpleNamespace(num_replicas=1),
        loggers=recorder, global_step=0,
    )  # fmt: skip
    sums, expected, since_read = MetricSums({}, torch.device("cpu")), [], 0
    with pytest.MonkeyPatch.context() as patch:  # a clock a second further at every read
        patch.setattr(base.intervals, "time", SimpleNamespace(perf_counter=lambda: clock.now))
        progress = Progress(trainer, 1, 0, len(sizes))
        for step, size in enumerate(sizes, start=1):
            sums.add(StepOutput(torch.tensor(0.5), batch_size=size))
            since_read += size
            if step % log_step == 0 or step == len(sizes):
                clock.now += 1.0
                log_interval(trainer, 1, step, sums, progress)
                expected.append(10.0 * since_read)
                since_read = 0
    assert [call[1]["time/step_flops_per_second"] for call in recorder.calls] == expected


def test_logger_names_are_checked_and_a_missing_package_is_named(make_config, monkeypatch, capsys):
    config = json.loads(make_config(**{"trainer.loggers": ["tensorboard", "neptune"]}).read_text())
    with pytest.raises(ConfigError, match=r"trainer.loggers: must be a list of distinct names"):
        ConfigParser(config, source="cfg.json")
    options = {"loggers": ["csv", "mlflow"], "tensorboard": True, "mlflow_tracking_uri": None}
    real_find_spec = importlib.util.find_spec
    # MLflow and sqlalchemy present (whether or not they are installed here), alembic missing.
    installed = {"mlflow": True, "sqlalchemy": True, "alembic": False}
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: (
            (object() if installed[name] else None)
            if name in installed
            else real_find_spec(name, *args)
        ),
    )
    with pytest.raises(UserError, match='"mlflow" needs the package alembic'):
        check_logger_packages(options, "cfg.json")
    # A tracking server needs no local store, so no alembic.
    check_logger_packages({**options, "mlflow_tracking_uri": "http://127.0.0.1:5000"}, "cfg.json")
    # train.py: a one-line error naming the package, and no run folder.
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "wandb" else real_find_spec(name, *args),
    )
    path = make_config(**{"trainer.loggers": ["csv", "wandb"]})
    assert train.main(["-c", str(path)]) == 2
    assert capsys.readouterr().err == (
        f'error: {path}: trainer.loggers: "wandb" needs the package wandb, which is not '
        "installed: pip install -r requirements-extras.txt (or wandb)\n"
    )
    assert not (path.parent / "saved").exists()


def test_confusion_matrix_counts_and_scores_match_a_hand_computed_example():
    # 3 classes, 6 samples: true labels and the predicted ones (argmax of one-hot logits).
    targets, predicted = [0, 0, 1, 1, 1, 2], [0, 1, 1, 1, 0, 1]
    matrix = ConfusionMatrix(3, torch.device("cpu"))
    logits = torch.nn.functional.one_hot(torch.tensor(predicted), 3).float()
    matrix.add(
        StepOutput(loss=torch.zeros(()), output=logits[:4], target=torch.tensor(targets[:4]))
    )
    matrix.add(
        StepOutput(loss=torch.zeros(()), output=logits[4:], target=torch.tensor(targets[4:]))
    )
    counts = matrix.all_ranks()
    assert counts.tolist() == [[1, 1, 0], [1, 2, 0], [0, 1, 0]]
    scores = class_scores(counts.tolist(), ["a", "b", "c"])
    assert scores["a"] == {"precision": 1 / 2, "recall": 1 / 2, "f1": 2 / 4, "support": 2}
    # b: predicted 4 times, 2 right; 3 samples.
    assert scores["b"] == {"precision": 2 / 4, "recall": 2 / 3, "f1": 4 / 7, "support": 3}
    # c: never predicted (precision undefined), its one sample missed (F1 0).
    assert scores["c"] == {"precision": None, "recall": 0.0, "f1": 0.0, "support": 1}
    # A class neither present nor predicted has no score at all.
    assert class_scores([[1, 0], [0, 0]], ["x", "y"])["y"]["f1"] is None
    # Outputs that are not (B, C) logits leave no matrix to show, rather than a wrong one.
    matrix.add(StepOutput(loss=torch.zeros(()), output=torch.zeros(2, 5), target=torch.zeros(2)))
    assert matrix.all_ranks() is None

    image = draw_confusion_matrix(counts, ["a", "b", "c"])
    pixels = image.load()
    # Each row shaded by its share: b's diagonal (2 of 3) darker than its (b, a) cell (1 of 3).
    width, height = image.size
    cell, left, top = 40, width - 4 - 3 * 40, height - 4 - 3 * 40
    diagonal = pixels[left + cell + 2, top + cell + 2]
    off_diagonal = pixels[left + 2, top + cell + 2]
    assert sum(diagonal) < sum(off_diagonal) < 3 * 255


def test_test_py_leaves_the_datas_ignore_index_out_of_the_confusion_matrix(
    make_config, monkeypatch, tmp_path
):
    """A classifier whose data declares an ignore_index (here class 0, a class left out): the
    matrix test.py reports is the whole one with that row emptied, as the loss and F1 skip those
    samples, not the whole one (nor an index error, for a label such as -100)."""
    metrics = [{"type": "F1", "args": {"num_classes": 10}}]  # a metric that takes ignore_index
    path = make_config(metrics=metrics, **{"trainer.epochs": 1, "trainer.monitor": "max val/F1"})
    monkeypatch.setattr(data_module.SyntheticDataLoader, "ignore_index", 0)
    assert train.main(["-c", str(path), "--run-id", "run"]) == 0
    run_dir, report = tmp_path / "saved" / RUN / "run", tmp_path / "report.json"
    evaluate = ["-r", str(run_dir), "--split", "val", "--json", str(report)]
    assert ENTRY_POINTS["test"].main(evaluate) == 0
    left_out = json.loads(report.read_text())["confusion_matrix"]
    monkeypatch.setattr(data_module.SyntheticDataLoader, "ignore_index", None)
    assert ENTRY_POINTS["test"].main([*evaluate, "--force"]) == 0
    whole = json.loads(report.read_text())["confusion_matrix"]
    assert sum(whole[0]) > 0  # the split has samples of class 0
    assert left_out == [[0] * 10, *whole[1:]]


def stopped_and_resumed(tmp_path: Path, loggers: list[str], **options) -> Path:
    """A 2-epoch run of 8 steps an epoch, stopped inside epoch 2 (as by SIGTERM) and resumed,
    in-process; returns its checkpoint folder."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["trainer"].update(log_step=1, type="StopAt", loggers=loggers, **options)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    stop = ["--set", "trainer.args.stop_at_step=11"]  # batch 3 of epoch 2
    assert train.main(["-c", str(path), "--run-id", "run", *stop]) == 128 + signal.SIGTERM
    run_dir = tmp_path / "saved" / RUN / "run"
    go_on = ["--set", "trainer.args.stop_at_step=0"]
    assert train.main(["-r", str(run_dir / "checkpoint-epoch2-step11.pth"), *go_on]) == 0
    return run_dir


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_csv_rows_equal_the_checkpoints_after_a_stop_and_two_resumes(stop_at, tmp_path):
    run_dir = stopped_and_resumed(tmp_path, ["tensorboard", "csv"])
    log_dir = tmp_path / "saved" / "log" / "Demo_CifarCNN" / "run"
    # The final validation's confusion matrix went to TensorBoard, at the last step.
    events = EventAccumulator(str(log_dir)).Reload()
    assert [event.step for event in events.Images("val/confusion_matrix")] == [16]
    # Then once more from the end of epoch 1: epoch 2 is trained (and logged) again.
    go_on = ["--set", "trainer.args.stop_at_step=0"]
    assert train.main(["-r", str(run_dir / "checkpoint-epoch1.pth"), *go_on]) == 0
    rows = read_csv(log_dir / "metrics.csv")
    assert [row["epoch"] for row in rows] == ["1", "2"]
    for row in rows:
        state = torch.load(run_dir / f"checkpoint-epoch{row['epoch']}.pth", weights_only=True)
        assert int(row.pop("step")) == state["global_step"]
        assert int(row.pop("epoch")) == state["epoch"]
        assert {key: float(value) for key, value in row.items()} == state["metrics"]
    steps = [(int(row["epoch"]), int(row["batch"])) for row in read_csv(log_dir / "steps.csv")]
    assert steps == [(epoch, batch) for epoch in (1, 2) for batch in range(1, 9)]

    # test.py: the matrix and per-class scores in --json, the image beside it and in TensorBoard.
    # TensorBoard reads a folder's event files in name order: the second each was created in,
    # then host, pid and a per-process counter as text ("10" before "9"). These runs take under
    # a second, so test.py's file could share the last resume's second and sort before it; that
    # resume's purge_step (9) then hid test.py's step-16 image (CI, once). A user's test.py comes
    # a training run later: wait for the next second, as the user's clock would have moved on.
    time.sleep(1.01 - time.time() % 1.0)
    report_path, image_path = tmp_path / "val.json", tmp_path / "val.png"
    arguments = ["-r", str(run_dir / "checkpoint-epoch2.pth"), "--split", "val"]
    arguments += ["--json", str(report_path), "--confusion-png", str(image_path)]
    assert ENTRY_POINTS["test"].main(arguments) == 0
    report = json.loads(report_path.read_text())
    counts = torch.tensor(report["confusion_matrix"])
    assert counts.shape == (10, 10) and counts.sum() == report["num_samples"] == 64
    assert report["metrics"]["val/accuracy"] == pytest.approx(int(counts.trace()) / 64, abs=1e-12)
    per_class = report["per_class"]
    assert [scores["support"] for scores in per_class.values()] == counts.sum(dim=1).tolist()
    assert report["per_class_accuracy"] == {name: s["recall"] for name, s in per_class.items()}
    assert image_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = EventAccumulator(str(log_dir)).Reload()
    assert [event.step for event in events.Images("test.py/val_confusion_matrix")] == [16]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 32), min_size=2, max_size=12), st.data())
def test_samples_per_second_counts_the_samples_trained_in_the_time_measured(sizes, data):
    """An epoch resumed from a mid-epoch checkpoint measures only the time of its own batches:
    its samples/s counts those, not the samples its restored sums hold (trained before)."""
    stop = data.draw(st.integers(1, len(sizes) - 1))  # batches before the checkpoint
    cpu, trainer = torch.device("cpu"), SimpleNamespace(flops_per_sample=None, data_wait_seconds=0)

    def samples_per_second(sums: MetricSums, batch_sizes: list[int]) -> float:
        for size in batch_sizes:
            sums.add(StepOutput(torch.tensor(0.5), batch_size=size))
        metrics = sums.result("train")
        epoch_speed(trainer, metrics, train_seconds=2.0)
        assert not any("num_" in key for key in metrics)  # counts are not logged
        return metrics["time/train_samples_per_second"]

    assert samples_per_second(MetricSums({}, cpu), sizes) == sum(sizes) / 2.0
    before = MetricSums({}, cpu)
    samples_per_second(before, sizes[:stop])
    resumed = MetricSums({}, cpu, before.state_dict())
    assert samples_per_second(resumed, sizes[stop:]) == sum(sizes[stop:]) / 2.0


class SecondStopwatch:
    """A Stopwatch whose every measure is one second: samples/s is then the samples counted."""

    def __init__(self, device: torch.device) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> float:
        return 1.0


def test_samples_per_second_after_a_mid_epoch_resume_counts_the_resumed_part(
    stop_at, tmp_path, monkeypatch
):
    monkeypatch.setattr(base.base_trainer, "Stopwatch", SecondStopwatch)
    run_dir = stopped_and_resumed(tmp_path, ["csv"])  # 8 batches of 32, stopped after batch 3
    rates = [
        torch.load(run_dir / f"checkpoint-epoch{epoch}.pth", weights_only=True)["metrics"][
            "time/train_samples_per_second"
        ]
        for epoch in (1, 2)
    ]
    assert rates == [8 * 32, 5 * 32]  # epoch 2 was 256 before: the 3 batches before the stop
    log_dir = tmp_path / "saved" / "log" / "Demo_CifarCNN" / "run"
    rows = read_csv(log_dir / "metrics.csv")
    assert [float(row["time/train_samples_per_second"]) for row in rows] == rates


def read_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of a tag as TensorBoard shows it: event files read in name order, each
    purge_step hiding the steps from it on that the files before it hold."""
    events = EventAccumulator(str(log_dir)).Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def write_last(log_dir: Path, name: str, start_step: int | None, write: Callable) -> None:
    """write(TensorboardLogger(log_dir, start_step)), its event file then renamed to sort after
    the folder's others, as one opened a second later would (they are read in name order)."""
    before = set(log_dir.glob("events.out.tfevents.*"))
    writer = TensorboardLogger(log_dir, start_step)
    write(writer)
    writer.close(finished=True)
    (new,) = set(log_dir.glob("events.out.tfevents.*")) - before
    new.rename(log_dir / f"events.out.tfevents.9999999999.{name}")


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 12), st.data())
def test_tensorboard_shows_each_step_once_and_test_py_hides_none(num_steps, data):
    """A resume at step S hides what a part cut short logged after S (each step shows once, the
    resumed values); test.py's image, at any checkpoint's step, hides none of the curves."""
    resume_at = data.draw(st.integers(0, num_steps))
    image_step = data.draw(st.integers(0, num_steps + 2))
    with tempfile.TemporaryDirectory() as folder:
        log_dir = Path(folder)
        first = TensorboardLogger(log_dir, 0)  # a run cut short after num_steps steps
        for step in range(1, num_steps + 1):
            first.log_scalars({"val/loss": step}, step)
        first.close(finished=False)

        def resumed(writer: TensorboardLogger) -> None:  # from its checkpoint at resume_at
            for step in range(resume_at + 1, num_steps + 2):
                writer.log_scalars({"val/loss": -step}, step)

        write_last(log_dir, "resumed", resume_at, resumed)
        expected = [
            (step, step if step <= resume_at else -step) for step in range(1, num_steps + 2)
        ]
        assert read_scalars(log_dir, "val/loss") == expected
        image = torch.zeros(3, 2, 2)
        write_last(
            log_dir, "test", None, lambda writer: writer.log_image("test", image, image_step)
        )
        assert read_scalars(log_dir, "val/loss") == expected


def test_test_py_keeps_the_training_curves_of_the_run_it_adds_an_image_to(tmp_path):
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert train.main(["-c", str(path), "--run-id", "run"]) == 0  # 2 epochs of 8 steps
    log_dir = tmp_path / "saved" / "log" / "Demo_CifarCNN" / "run"
    before = read_scalars(log_dir, "val/loss")
    assert [step for step, _ in before] == [8, 16]
    time.sleep(1.01 - time.time() % 1.0)  # test.py's event file sorts after the run's
    checkpoint = tmp_path / "saved" / RUN / "run" / "checkpoint-epoch1.pth"
    assert ENTRY_POINTS["test"].main(["-r", str(checkpoint), "--split", "val"]) == 0
    events = EventAccumulator(str(log_dir)).Reload()
    assert [event.step for event in events.Images("test.py/val_confusion_matrix")] == [8]
    assert read_scalars(log_dir, "val/loss") == before  # were hidden from step 1 on


def wandb_history(run_dir: Path) -> list[dict]:
    """The logged rows of an offline W&B run, from its run-<id>.wandb file: LevelDB-style log
    records (7-byte headers in 32 KiB blocks) of protobuf Records."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("run-*.wandb")
    data, rows, offset, pending = path.read_bytes(), [], 7, b""  # after the file header
    while offset + 7 <= len(data):
        if 32768 - offset % 32768 < 7:  # a block's tail too short for a header: padding
            offset += 32768 - offset % 32768
            continue
        length, kind = int.from_bytes(data[offset + 4 : offset + 6], "little"), data[offset + 6]
        pending += data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = record.history.item
                rows.append(
                    {
                        item.key or "/".join(item.nested_key): json.loads(item.value_json)
                        for item in items
                    }
                )
    return rows


def test_wandb_and_mlflow_continue_their_run_and_hold_the_checkpoint_metrics(stop_at, tmp_path):
    for package in ("wandb", "mlflow"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (pip install -r requirements-extras.txt)")
    from mlflow.tracking import MlflowClient

    run_dir = stopped_and_resumed(tmp_path, ["wandb", "mlflow"], wandb_mode="offline")
    states = [
        torch.load(run_dir / f"checkpoint-epoch{epoch}.pth", weights_only=True) for epoch in (1, 2)
    ]
    run_ids = states[-1]["logger_runs"]
    assert set(run_ids) == {"wandb", "mlflow", "log_dir"}

    # W&B: one offline folder per part of the run, both with the run's id.
    log_dir = tmp_path / "saved" / "log" / "Demo_CifarCNN"
    folders = sorted((log_dir / "run" / "wandb").glob("offline-run-*"))
    assert [folder.name.rpartition("-")[2] for folder in folders] == [run_ids["wandb"]] * 2
    epochs = [row for folder in folders for row in wandb_history(folder) if "epoch" in row]
    assert [row["epoch"] for row in epochs] == [1, 2]
    for row, state in zip(epochs, states, strict=True):
        assert row["global_step"] == state["global_step"]
        assert {key: row[key] for key in state["metrics"]} == pytest.approx(state["metrics"])

    # MLflow: one run in the experiment's local store, finished, with the config as parameters.
    client = MlflowClient(tracking_uri=f"sqlite:///{log_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("Demo_CifarCNN")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == run_ids["mlflow"] and run.info.status == "FINISHED"
    assert run.data.params["trainer.epochs"] == "2"
    for key in ("val/loss", "train/accuracy", "lr"):
        history = {
            point.step: point.value for point in client.get_metric_history(run.info.run_id, key)
        }
        assert history == {state["global_step"]: state["metrics"][key] for state in states}
    artifacts = [item.path for item in client.list_artifacts(run.info.run_id, "val")]
    assert artifacts == ["val/confusion_matrix-step16.png"]


def fake_wandb(inits: list[dict]) -> ModuleType:
    """A stand-in for the wandb package that records each wandb.init call's arguments; a new
    run (no id given) gets the id new-<n>."""

    def init(**options) -> SimpleNamespace:
        run_id = options["id"] or f"new-{len(inits)}"
        inits.append(options)
        return SimpleNamespace(
            id=run_id,
            define_metric=lambda *a, **k: None,
            log=lambda row: None,
            finish=lambda **k: None,
        )

    module = ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # find_spec finds it
    module.init, module.Settings, module.Image = init, dict, lambda pixels: pixels
    return module


def test_a_copied_run_folder_starts_new_tracking_runs_and_the_original_continues_its_own(
    stop_at, tmp_path, monkeypatch
):
    """cp -r run run2 and resume run2: it must not write into run's W&B run (run2's log folder
    knows nothing of what that run holds); resuming run itself continues its run."""
    inits: list[dict] = []
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(inits))
    run_dir = tmp_path / "saved" / RUN / "run"
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["trainer"].update(type="StopAt", loggers=["wandb"], tensorboard=False)
    (tmp_path / "config.json").write_text(json.dumps(config))
    stop = ["--set", "trainer.args.stop_at_step=11"]  # inside epoch 2
    assert train.main(["-c", str(tmp_path / "config.json"), "--run-id", "run", *stop]) == 143
    copy_dir = run_dir.with_name("run2")
    shutil.copytree(run_dir, copy_dir)
    go_on = ["--set", "trainer.args.stop_at_step=0"]

    assert train.main(["-r", str(copy_dir / "checkpoint-epoch2-step11.pth"), *go_on]) == 0
    assert train.main(["-r", str(run_dir / "checkpoint-epoch2-step11.pth"), *go_on]) == 0

    assert [options["id"] for options in inits] == [None, None, "new-0"]
    copy_runs = torch.load(copy_dir / "checkpoint-epoch2.pth", weights_only=True)["logger_runs"]
    assert copy_runs["wandb"] == "new-1"
    log = (tmp_path / "saved" / "log" / "Demo_CifarCNN" / "run2" / "info.log").read_text()
    assert "(a copied or moved run folder): new ones start here." in log
    runs = torch.load(run_dir / "checkpoint-epoch2.pth", weights_only=True)["logger_runs"]
    assert runs["wandb"] == "new-0"


def step_losses(tmp_path: Path, run_id: str, argv: list[str]) -> list[tuple[int, float]]:
    """train.py's train/step_loss as TensorBoard shows it, after train.main(argv) (a Crash
    of StopAt counts as the process dying)."""
    with contextlib.suppress(Crash):
        train.main(argv)
    log_dir = tmp_path / "saved" / "log" / "Demo_CifarCNN" / run_id
    time.sleep(1.1)  # the next event file sorts after this one (named by the second)
    return read_scalars(log_dir, "train/step_loss")


@pytest.mark.slow
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(log_step=st.integers(1, 3), accumulate=st.integers(2, 4), data=st.data())
@example(log_step=1, accumulate=4, data=None)  # the case found: rows of epoch 2 at step 2
def test_tensorboard_after_a_crash_and_resume_equals_an_uninterrupted_run(
    stop_at, log_step, accumulate, data
):
    """Any log_step (also under the accumulation), any crash after epoch 1: TensorBoard shows
    each row once, as an uninterrupted run logs it (values equal: the resume is exact)."""
    steps_per_epoch = -(-8 // accumulate)  # 8 batches an epoch
    extra = 2 if data is None else data.draw(st.integers(1, steps_per_epoch))
    with tempfile.TemporaryDirectory() as folder:
        tmp_path = Path(folder)
        config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
        config["trainer"].update(
            type="StopAt", epochs=2, log_step=log_step, grad_accum_steps=accumulate
        )
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
        whole = step_losses(tmp_path, "whole", ["-c", str(path), "--run-id", "whole"])
        crash = ["--set", f"trainer.args.crash_at_step={steps_per_epoch + extra}"]
        step_losses(tmp_path, "cut", ["-c", str(path), "--run-id", "cut", *crash])
        run_dir = tmp_path / "saved" / RUN / "cut"
        resume = [
            "-r",
            str(run_dir / "checkpoint-epoch1.pth"),
            "--set",
            "trainer.args.crash_at_step=0",
        ]
        resumed = step_losses(tmp_path, "cut", resume)
    assert [step for step, _ in resumed] == [step for step, _ in whole]
    assert [value for _, value in resumed] == pytest.approx([value for _, value in whole])

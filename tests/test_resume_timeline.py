"""Resume on the paths long runs take (issue 19, items 1-3, 7-10): the run's timeline after a
restart from an earlier checkpoint, a damaged newest checkpoint, a kill inside a save, other
data, the loggers after a crash, file modes and a full disk."""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ENTRY_POINTS, ROOT, Crash, run_main, shrink
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import train
from utils.state.checkpoint import read_latest, sorted_checkpoints

RUN = Path("models") / "Demo_CifarCNN"


def demo(tmp_path: Path, **trainer: object) -> Path:
    """The shrunk demo (256 training samples: 8 steps an epoch), 3 epochs, deterministic."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["trainer"].update({"epochs": 3, "deterministic": True, "type": "StopAt", **trainer})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def names(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def epoch_of(path: Path) -> tuple[int, int]:
    state = torch.load(path, weights_only=True)
    return state["epoch"], state["global_step"]


# --- 1. the timeline ----------------------------------------------------------------------------


def test_a_restart_from_an_earlier_checkpoint_becomes_the_run_timeline(stop_at, tmp_path, capsys):
    config = demo(tmp_path, save_top_k=3)
    assert train.main(["-c", str(config), "--run-id", "run"]) == 0
    run_dir = tmp_path / "saved" / RUN / "run"
    before = {
        name: (run_dir / name).read_bytes() for name in names(run_dir) if name.endswith(".pth")
    }
    best_later = epoch_of(run_dir / "model_best.pth")[0] > 1  # then it belongs to what is left
    # Back to the end of epoch 1; killed in epoch 2 before anything is saved.
    with pytest.raises(Crash):
        train.main(
            ["-r", str(run_dir / "checkpoint-epoch1.pth"), "--set", "trainer.args.crash_at_step=12"]
        )
    # The abandoned timeline's files are kept aside, never chosen: the requeue resumes epoch 1.
    (aside,) = (run_dir / "abandoned").iterdir()
    assert names(aside) == [
        "checkpoint-epoch2.pth", "checkpoint-epoch3.pth", "model_best-epoch2.pth",
        "model_best-epoch3.pth", *(["model_best.pth"] if best_later else []),
    ]  # fmt: skip
    assert {name: (aside / name).read_bytes() for name in names(aside)} == {
        name: data for name, data in before.items() if name in names(aside)
    }
    # model_best.pth is the best of the timeline: epoch 1 (the only epoch left), rebuilt.
    assert epoch_of(run_dir / "model_best.pth")[0] == 1
    assert read_latest(run_dir)[0] == run_dir / "checkpoint-epoch1.pth"
    # Preempted in epoch 2 (SIGTERM): the requeued job continues from that point.
    go_on = ["--set", "trainer.args.crash_at_step=0"]
    assert train.main(["-r", str(run_dir), *go_on, "--set", "trainer.args.stop_at_step=11"]) == 143
    assert names(run_dir)[0:2] == ["abandoned", "checkpoint-epoch1.pth"]
    assert (run_dir / "checkpoint-epoch2-step11.pth").is_file()
    capsys.readouterr()
    assert train.main(["-r", str(run_dir), *go_on, "--set", "trainer.args.stop_at_step=0"]) == 0
    log = capsys.readouterr().out
    assert "checkpoint-epoch2-step11.pth (epoch 1 done, then 3 batches" in log
    assert "already done" not in log
    assert epoch_of(run_dir / "checkpoint-epoch3.pth") == (3, 24)
    # The new timeline's files hold the same training as the first (deterministic): equal.
    first = torch.load(aside / "checkpoint-epoch3.pth", weights_only=True)
    second = torch.load(run_dir / "checkpoint-epoch3.pth", weights_only=True)
    assert all(torch.equal(first["model"][key], second["model"][key]) for key in first["model"])
    assert first["timeline"]["id"] != second["timeline"]["id"]
    assert second["timeline"]["parent"] == "checkpoint-epoch2.pth"


def test_a_save_that_landed_just_before_a_crash_is_the_head_though_latest_lags(stop_at, tmp_path):
    config = demo(tmp_path)
    assert train.main(["-c", str(config), "--run-id", "run"]) == 0
    run_dir = tmp_path / "saved" / RUN / "run"
    latest = (run_dir / "latest").read_text()
    (run_dir / "latest").write_text(latest.replace("epoch3", "epoch2"))  # killed before updating it
    assert train.main(["-r", str(run_dir)]) == 0
    assert not (
        run_dir / "abandoned"
    ).exists()  # epoch 3 is the same timeline: resumed, not set aside


def test_keep_last_holds_also_after_a_kill_between_a_save_and_its_deletions(stop_at, tmp_path):
    config = demo(tmp_path)  # keep_last null: all three checkpoints
    assert train.main(["-c", str(config), "--run-id", "run"]) == 0
    run_dir = tmp_path / "saved" / RUN / "run"
    assert len(sorted_checkpoints(run_dir)) == 3  # as a kill right after saving epoch 3 leaves
    assert train.main(["-r", str(run_dir), "--set", "trainer.keep_last=2"]) == 0  # all done
    assert sorted_checkpoints(run_dir) == [run_dir / f"checkpoint-epoch{e}.pth" for e in (2, 3)]


# --- 2. a damaged newest checkpoint ---------------------------------------------------------------


@pytest.mark.parametrize("how", ["-r", "auto_resume"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(stop_at, tmp_path, capsys, how):
    config = demo(tmp_path, epochs=2)
    assert train.main(["-c", str(config), "--run-id", "run"]) == 0
    run_dir = tmp_path / "saved" / RUN / "run"
    newest = run_dir / "checkpoint-epoch2.pth"
    newest.write_bytes(newest.read_bytes()[:1000])  # a full disk elsewhere, a bad copy
    args = ["-r", str(run_dir)] if how == "-r" else ["-c", str(config), "--run-id", "run"]
    auto = ["--set", "trainer.auto_resume=true"] if how == "auto_resume" else []
    capsys.readouterr()
    assert train.main([*args, *auto]) == 0
    log = capsys.readouterr().out
    assert f"{newest}: not a readable checkpoint" in log
    assert "resuming from the checkpoint before it" in log
    assert "Resumed from" in log and "checkpoint-epoch1.pth (epoch 1 done)" in log
    assert epoch_of(newest) == (2, 16)  # trained again
    (aside,) = (run_dir / "abandoned").iterdir()
    assert "checkpoint-epoch2.pth" in names(aside)


def test_no_readable_checkpoint_is_one_line_and_exit_2(stop_at, tmp_path, capsys):
    config = demo(tmp_path, epochs=1)
    assert train.main(["-c", str(config), "--run-id", "run"]) == 0
    run_dir = tmp_path / "saved" / RUN / "run"
    (run_dir / "checkpoint-epoch1.pth").write_bytes(b"not a checkpoint")
    capsys.readouterr()
    assert train.main(["-r", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run_dir}: none of its 1 checkpoint(s) can be read")
    assert err.count("\n") == 1
    assert names(run_dir) == ["checkpoint-epoch1.pth", "config.json", "latest", "model_best.pth"]


# --- 3. a kill inside a save ----------------------------------------------------------------------


def test_a_folder_whose_first_save_died_restarts_and_its_leftovers_are_removed(stop_at, tmp_path):
    config = demo(tmp_path, epochs=1)
    run_dir = tmp_path / "saved" / RUN / "run"
    run_dir.mkdir(parents=True)
    shutil.copy(config, run_dir / "config.json")
    leftover = run_dir / ".checkpoint-epoch1.pth.0123456789abcdef.tmp"  # what a kill -9 leaves
    leftover.write_bytes(b"half a checkpoint")
    assert train.main(["-r", str(run_dir)]) == 0  # restarted from epoch 1
    assert not leftover.exists() and (run_dir / "checkpoint-epoch1.pth").is_file()
    # The same with the run's --run-id reused (a job script that always passes it).
    shutil.rmtree(run_dir)
    run_dir.mkdir()
    shutil.copy(config, run_dir / "config.json")
    leftover.write_bytes(b"half")
    assert train.main(["-c", str(config), "--run-id", "run"]) == 0
    assert not leftover.exists()


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_a_kill_inside_a_checkpoint_write_keeps_the_previous_one(tmp_path, spawn):
    config = demo(tmp_path, epochs=2, type="Trainer")
    run_dir = tmp_path / "saved" / RUN / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FAULT_SLOW_SAVE": "30"}
    process = spawn(
        [sys.executable, "tests/faulty_train.py", "-c", str(config), "--run-id", "run"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    while not list(run_dir.glob(".checkpoint-epoch1.pth.*.tmp")):  # inside the first save
        assert process.poll() is None
        time.sleep(0.01)
    process.kill()
    process.wait()
    assert names(run_dir)[0].startswith(".checkpoint-epoch1.pth.")  # no checkpoint, a leftover
    result = run_main("train.py", "-r", str(run_dir))  # restartable
    assert result.returncode == 0, result.stderr
    assert "Removed 1 file(s) left by saves cut short" in result.stdout
    assert names(run_dir) == [
        "checkpoint-epoch1.pth",
        "checkpoint-epoch2.pth",
        "config.json",
        "latest",
        "model_best.pth",
    ]


# --- 7. the data a run trains on ------------------------------------------------------------------


def write_images(folder: Path, count: int) -> None:
    for index in range(count):
        label = "a" if index % 2 else "b"
        (folder / "train" / label).mkdir(parents=True, exist_ok=True)
        pixels = np.full((8, 8, 3), index * 6, dtype=np.uint8)
        Image.fromarray(pixels).save(folder / "train" / label / f"{index:03d}.png")


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_other_data_is_refused_on_resume_and_by_test_py_val_unless_allowed(tmp_path, capsys):
    data = tmp_path / "images"
    write_images(data, 40)
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["data_loader"] = {
        "type": "ImageFolderDataLoader",
        "args": {
            "data_dir": str(data),
            "preset": "cifar",
            "batch_size": 8,
            "validation_split": 0.2,
        },
    }
    config["arch"]["args"]["num_classes"] = 2
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert train.main(["-c", str(path), "--run-id", "run"]) == 0
    run_dir = tmp_path / "saved" / "models" / "Demo_CifarCNN" / "run"
    write_images(data, 41)  # one image added: the validation split moves
    capsys.readouterr()
    assert train.main(["-r", str(run_dir / "checkpoint-epoch1.pth"), "--epochs", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the data changed since this checkpoint" in err
    assert "training split: 33 samples, 32 before; validation split: other samples (8)" in err
    assert "--allow-data-change" in err and not (run_dir / "abandoned").exists()
    test_py = ENTRY_POINTS["test"].main  # in-process: each subprocess would import torch again
    test_args = ["-r", str(run_dir / "checkpoint-epoch2.pth"), "--split", "val"]
    assert test_py(test_args) == 2
    assert "validation split: other samples (8)" in capsys.readouterr().err
    assert test_py([*test_args, "--allow-data-change"]) == 0
    assert train.main(["-r", str(run_dir), "--epochs", "3", "--allow-data-change"]) == 0
    assert epoch_of(run_dir / "checkpoint-epoch3.pth")[0] == 3


# --- 8. loggers after a crash ------------------------------------------------------------------


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_loggers_hold_each_step_once_after_a_crash_and_the_first_interval_is_exact(
    stop_at, tmp_path
):
    config = demo(tmp_path, log_step=4, loggers=["tensorboard", "csv"])
    assert train.main(["-c", str(config), "--run-id", "straight"]) == 0
    # Stopped at step 11 (inside a log_step interval), resumed, crashed at step 20 (logged up to
    # step 19, saved up to 16), resumed.
    stop = ["--set", "trainer.args.stop_at_step=11"]
    assert train.main(["-c", str(config), "--run-id", "run", *stop]) == 143
    run_dir = tmp_path / "saved" / RUN / "run"
    crash = ["--set", "trainer.args.stop_at_step=0", "--set", "trainer.args.crash_at_step=20"]
    # TensorBoard orders a folder's event files by name: time in seconds, host, process id and a
    # count of writers in the process. Each run of a job is a process of its own that starts
    # seconds later; in one process (a pytest worker) the counts may sort out of order.
    time.sleep(1.1)
    with pytest.raises(Crash):
        train.main(["-r", str(run_dir), *crash])
    time.sleep(1.1)
    assert train.main(["-r", str(run_dir), "--set", "trainer.args.crash_at_step=0"]) == 0
    logs = tmp_path / "saved" / "log" / "Demo_CifarCNN"
    straight, resumed = (
        EventAccumulator(str(logs / name)).Reload() for name in ("straight", "run")
    )
    for tag in ("train/step_loss", "val/loss", "train/loss"):
        values = [(event.step, event.value) for event in resumed.Scalars(tag)]
        assert values == [(event.step, event.value) for event in straight.Scalars(tag)], tag
    rows = [line.split(",")[:4] for line in (logs / "run" / "steps.csv").read_text().splitlines()]
    assert rows == [
        line.split(",")[:4] for line in (logs / "straight" / "steps.csv").read_text().splitlines()
    ]


# --- 9. file modes ---------------------------------------------------------------------------------


def test_outputs_respect_the_umask(stop_at, tmp_path):
    config = demo(tmp_path, epochs=1, loggers=["tensorboard", "csv"])
    previous = os.umask(0o022)
    try:
        assert train.main(["-c", str(config), "--run-id", "run"]) == 0
    finally:
        os.umask(previous)
    run_dir = tmp_path / "saved" / RUN / "run"
    log_dir = tmp_path / "saved" / "log" / "Demo_CifarCNN" / "run"
    files = [*run_dir.iterdir(), log_dir / "metrics.csv", log_dir / "steps.csv"]
    assert {path.name: stat.S_IMODE(path.stat().st_mode) for path in files} == {
        path.name: 0o644 for path in files
    }


# --- 10. a full disk during a save -----------------------------------------------------------------


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_full_disk_is_one_line_exit_1_on_every_rank_and_keeps_what_was_saved(tmp_path, processes):
    config = demo(tmp_path, type="Trainer")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "FAULT_FULL_DISK": "3"}
    script = ["tests/faulty_train.py", "-c", str(config), "--run-id", "run"]
    launcher = [sys.executable]
    if processes == 2:
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    result = subprocess.run(
        [*launcher, *script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )  # no hang: every rank exits
    assert result.returncode == 1, result.stderr[-2000:]
    run_dir = tmp_path / "saved" / RUN / "run"
    # Save 3 is epoch 2's checkpoint (1: epoch 1's, 2: its model_best.pth).
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    # One line per rank, no traceback from the template (torchrun prints its own report).
    ours = re.compile(rf'File "{re.escape(str(ROOT))}/(?!\.venv)')  # a frame of the template
    assert len(lines) == processes and not ours.search(result.stderr)
    assert lines[0] == (
        f"error: {run_dir}/checkpoint-epoch2.pth: cannot save (No space left on device); the "
        f"checkpoints saved before are intact: make room, then resume with -r {run_dir}"
    )
    assert names(run_dir) == ["checkpoint-epoch1.pth", "config.json", "latest", "model_best.pth"]
    assert sorted_checkpoints(run_dir) == [run_dir / "checkpoint-epoch1.pth"]

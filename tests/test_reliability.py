"""Fault tolerance: exact resume after SIGKILL, SIGTERM preemption, crash-safe saves, keep_last,
non-finite losses and the stop-signal handler.

The runs that are killed or signalled are real train.py processes; the reference run and the
resumes after them call train.main in-process (run_main), and must match them bit for bit."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_main, wait_for_file

from utils.state.checkpoint import load_checkpoint, read_latest, save_checkpoint, sorted_checkpoints
from utils.state.signals import StopRequest

RUN = Path("models") / "Demo_CifarCNN"


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A deterministic 3-epoch demo config with epochs long enough (120 batches) to interrupt."""
    import json

    from conftest import shrink

    tmp_path = tmp_path_factory.mktemp("reliability")
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["trainer"].update(
        epochs=3, len_epoch=120, keep_last=2, deterministic=True, tensorboard=False, log_step=5
    )
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def uninterrupted(config_path: Path) -> Path:
    """The reference: the same config trained start to finish without interruption."""
    result = run_main("train.py", "-c", str(config_path), "--run-id", "reference")
    assert result.returncode == 0, result.stderr
    return config_path.parent / "saved" / RUN / "reference"


def start_training(spawn, config_path: Path, run_id: str) -> subprocess.Popen:
    # One thread, as run_main's runs: bit-exactness holds for the same thread count (intra-op
    # parallel reductions add in a different order with more threads).
    env = {"OMP_NUM_THREADS": "1", **os.environ, "CUDA_VISIBLE_DEVICES": ""}
    return spawn(
        [sys.executable, "train.py", "-c", str(config_path), "--run-id", run_id],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def assert_same_training_state(first: Path, second: Path) -> None:
    """Every tensor of the model and the optimizer state is bit-for-bit equal."""
    a, b = torch.load(first, weights_only=True), torch.load(second, weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for index, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][index][key]), (index, key)
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    assert (
        a["global_step"] == b["global_step"]
        and a["metrics"]["val/loss"] == b["metrics"]["val/loss"]
    )


def test_outputs_with_keep_last(uninterrupted: Path) -> None:
    names = sorted(path.name for path in uninterrupted.iterdir())
    assert names == [
        "checkpoint-epoch2.pth",
        "checkpoint-epoch3.pth",
        "config.json",
        "latest",
        "model_best.pth",
    ]
    assert read_latest(uninterrupted)[0] == uninterrupted / "checkpoint-epoch3.pth"


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_sigkill_then_resume_is_bit_exact(spawn, config_path: Path, uninterrupted: Path) -> None:
    run_dir = config_path.parent / "saved" / RUN / "killed"
    process = start_training(spawn, config_path, "killed")
    wait_for_file(process, run_dir / "checkpoint-epoch1.pth")
    process.kill()  # SIGKILL during epoch 2: no handler runs, nothing is flushed
    process.communicate()
    assert not (run_dir / "checkpoint-epoch2.pth").exists(), "the kill came too late"

    # -r with the run folder resumes from the newest complete checkpoint.
    result = run_main("train.py", "-r", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert "Resumed from" in result.stdout and "epoch 1 done" in result.stdout
    assert_same_training_state(
        uninterrupted / "checkpoint-epoch3.pth", run_dir / "checkpoint-epoch3.pth"
    )


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_sigterm_saves_mid_epoch_and_resume_finishes_exactly(
    spawn, config_path: Path, uninterrupted: Path
) -> None:
    run_dir = config_path.parent / "saved" / RUN / "preempted"
    process = start_training(spawn, config_path, "preempted")
    wait_for_file(process, run_dir / "checkpoint-epoch1.pth")
    time.sleep(0.2)  # into epoch 2 (an epoch takes about a second)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert time.monotonic() - sent < 10
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "stopped by SIGTERM; resume with: -r" in stderr

    saved = sorted_checkpoints(run_dir)[-1]
    assert saved.name.startswith("checkpoint-epoch2-step"), saved
    state = load_checkpoint(saved)
    batches = state["position"]["batches"]
    # trainer.len_epoch sets the epoch's length (15 passes): a position in batches only.
    assert state["epoch"] == 1 and 0 < batches < 120 and state["position"]["samples"] is None

    result = run_main("train.py", "-r", str(saved))
    assert result.returncode == 0, result.stderr
    assert f"epoch 1 done, then {batches} batches of epoch 2" in result.stdout
    # Data order, skipped batches and RNG state all line up: the result equals the
    # uninterrupted run's (num_workers 0, CPU, deterministic).
    assert_same_training_state(
        uninterrupted / "checkpoint-epoch3.pth", run_dir / "checkpoint-epoch3.pth"
    )


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_a_failed_save_leaves_the_previous_checkpoint_resumable(
    uninterrupted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted, run_dir)
    path = run_dir / "checkpoint-epoch2.pth"
    before = path.read_bytes()

    def write_half_then_fail(state: dict, file) -> None:
        file.write(before[: len(before) // 2])
        raise OSError(28, "No space left on device")

    import utils.state.checkpoint

    monkeypatch.setattr(utils.state.checkpoint.torch, "save", write_half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint({"epoch": 99}, path)
    monkeypatch.undo()

    assert path.read_bytes() == before
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".")) == []  # no temp file
    result = run_main("train.py", "-r", str(path))
    assert result.returncode == 0, result.stderr
    assert "epoch 3/3" in result.stdout


def test_nonfinite_loss_stops_and_keeps_model_best(uninterrupted: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted, run_dir)
    before = {path.name: path.read_bytes() for path in run_dir.glob("*.pth")}
    # A changed optimizer starts afresh; SGD at lr 1e38 overflows float32 within two steps.
    result = run_main(
        "train.py", "-r", str(run_dir / "checkpoint-epoch2.pth"),
        "--set", "optimizer.type=SGD", "--lr", "1e38", "--epochs", "4",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "error: non-finite loss at epoch 3, step" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    # The restart from epoch 2 made it the run's timeline: the epoch-3 checkpoint moved aside,
    # intact; model_best.pth (epoch 2) stayed; nothing was written from NaN weights.
    (aside,) = (run_dir / "abandoned").iterdir()
    kept = {**{p.name: p.read_bytes() for p in run_dir.glob("*.pth")}}
    assert {**kept, **{p.name: p.read_bytes() for p in aside.glob("*.pth")}} == before
    assert sorted(kept) == ["checkpoint-epoch2.pth", "model_best.pth"]


def test_nonfinite_skip_policy_gives_up_after_too_many(config_path: Path, tmp_path: Path) -> None:
    result = run_main(
        "train.py", "-c", str(config_path), "--run-id", "skips",
        "--set", "optimizer.type=SGD", "--lr", "1e38",
        "--set", "trainer.nonfinite=skip", "--set", "trainer.max_skipped_steps=3",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "more than trainer.max_skipped_steps (3) steps had a non-finite loss" in result.stderr
    assert result.stdout.count("Skipped step") == 4


def test_stop_request_turns_signals_into_a_flag_and_a_second_one_interrupts() -> None:
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.signum == signal.SIGUSR1
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

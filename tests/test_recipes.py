"""The techniques together, end to end through train.py and test.py: a run with every one of
them on trains, resumes bit-exact from a mid-epoch stop (the weight average included), keeps
its top-k checkpoints, runs under 2-process torchrun; and the shipped recipes build.

The runs call the scripts' main in-process (conftest's run_main), but the one stopped by SIGTERM
and the torchrun job: those are real processes."""

import json
import math
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, noise_image_folder, run_main, set_flags, shrink, wait_for_file
from test_distributed import epoch_lines, run_torchrun
from test_reliability import assert_same_training_state, start_training

import train
from utils.state.checkpoint import load_checkpoint, sorted_checkpoints

RUN = Path("models") / "Demo_CifarCNN"
# Every technique of issue 11 on (and Lookahead, with trainer below), on the demo network and data.
TECHNIQUES = {
    "lr_scheduler": {
        "type": "CosineAnnealingLR", "args": {}, "interval": "step", "warmup_epochs": 0.5,
    },
    "loss": {"type": "cross_entropy", "args": {"label_smoothing": 0.1}},
    "batch_mixing": {"mixup_alpha": 0.2, "cutmix_alpha": 1.0},
    "optimizer": {
        "type": "SGD", "args": {"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4},
        "norm_bias_weight_decay": 0.0, "reference_batch_size": 64,
    },
}  # fmt: skip


def recipe_config(save_dir: Path, **trainer) -> dict:
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), save_dir)
    config.update(json.loads(json.dumps(TECHNIQUES)))
    config["data_loader"]["args"].update(auto_augment="trivialaugment", random_erasing=0.25)
    config["trainer"].update(
        epochs=2, tensorboard=False, ema_decay=0.9, ema_period=2, save_top_k=1,
        monitor="max val/ema_accuracy", lookahead_period=7, lookahead_decay=0.8,
        lookahead_ramp=3, **trainer,
    )  # fmt: skip
    return config


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Epochs of 60 batches, long enough to interrupt; deterministic kernels."""
    tmp_path = tmp_path_factory.mktemp("recipes")
    config = recipe_config(tmp_path / "saved", len_epoch=60, deterministic=True, log_step=5)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def reference(config_path: Path) -> dict:
    result = run_main("train.py", "-c", str(config_path), "--run-id", "reference")
    assert result.returncode == 0, result.stderr
    return {"run_dir": config_path.parent / "saved" / RUN / "reference", "stdout": result.stdout}


def test_a_run_with_every_technique_validates_both_weights(reference: dict) -> None:
    state = load_checkpoint(reference["run_dir"] / "checkpoint-epoch2.pth")
    metrics = state["metrics"]
    assert {"val/accuracy", "val/ema_accuracy", "val/ema_loss"} <= metrics.keys()
    assert metrics["val/ema_loss"] != metrics["val/loss"]  # two different sets of weights
    assert int(state["ema"]["n_averaged"]) == 120 // 2  # every ema_period optimizer steps
    # Step 120, the last, is not one of Lookahead's (every 7): after it the model is slow.
    assert state["lookahead"].keys() == {
        k for k, v in state["model"].items() if v.is_floating_point()
    }
    for key, slow in state["lookahead"].items():
        assert torch.equal(state["model"][key], slow), key
    # lr 0.05 for reference batch 64 on the global batch of 32: logged as 0.025 at the start.
    assert "Learning rate(s): 0.025, 0.025: optimizer lr x global batch 32" in reference["stdout"]
    # Per step: the warmup ends after half an epoch, the cosine reaches 0 at the last step.
    assert metrics["lr"] == pytest.approx(0.025 * (1 + math.cos(math.pi * 30 / 90)) / 2)


def test_a_resume_in_another_batch_geometry_counts_ema_and_lookahead_in_its_steps(
    reference: dict, tmp_path: Path
) -> None:
    """Issue 31, item 6: epoch 1 in 60 steps of 32 samples, then epoch 2 in the 16 steps of an
    epoch of 16-sample batches (len_epoch off). EMA and Lookahead count the steps done in the
    new batches (16 after epoch 1, 32 at the end), as the schedule does, not the global step
    (60 + 16): the run ends on the slow weights, and the count carries over later resumes."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("checkpoint-epoch1.pth", "config.json"):
        (run_dir / name).write_bytes((reference["run_dir"] / name).read_bytes())
    resized = ["--bs", "16", "--set", "trainer.len_epoch=null"]
    result = run_main("train.py", "-r", str(run_dir / "checkpoint-epoch1.pth"), *resized)
    assert result.returncode == 0, result.stderr[-3000:]
    state = load_checkpoint(run_dir / "checkpoint-epoch2.pth")
    assert state["global_step"] == 60 + 16
    for key, slow in state["lookahead"].items():
        assert torch.equal(state["model"][key], slow), key
    assert state["global_step"] - state["step_offset"] == 2 * 16
    result = run_main("train.py", "-r", str(run_dir), "--epochs", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    state = load_checkpoint(run_dir / "checkpoint-epoch3.pth")
    assert state["global_step"] - state["step_offset"] == 3 * 16
    for key, slow in state["lookahead"].items():
        assert torch.equal(state["model"][key], slow), key


def test_top_k_checkpoints_are_the_best_epochs(reference: dict) -> None:
    run_dir = reference["run_dir"]
    values = {
        epoch: load_checkpoint(run_dir / f"checkpoint-epoch{epoch}.pth")["metrics"]
        for epoch in (1, 2)
    }
    # save_top_k 1: the best epoch by val/ema_accuracy (the earlier one on a tie) stays.
    best = max(values, key=lambda epoch: (values[epoch]["val/ema_accuracy"], -epoch))
    kept = [path.name for path in run_dir.glob("model_best-epoch*.pth")]
    assert kept == [f"model_best-epoch{best}.pth"]
    assert load_checkpoint(run_dir / "model_best.pth")["epoch"] == best


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_test_py_ema_reproduces_the_validation_of_the_averaged_weights(
    reference: dict, tmp_path: Path
) -> None:
    checkpoint = reference["run_dir"] / "checkpoint-epoch2.pth"
    metrics = load_checkpoint(checkpoint)["metrics"]
    for ema, prefix in ((True, "val/ema_"), (False, "val/")):
        output = tmp_path / f"{ema}.json"
        # The recipe monitors val/ema_accuracy: without --weights test.py takes the average.
        flags = ["--ema"] if ema else ["--weights", "trained"]
        result = run_main(
            "test.py", "-r", str(checkpoint), "--split", "val", "--json", str(output), *flags
        )
        assert result.returncode == 0, result.stderr
        tested = json.loads(output.read_text())["metrics"]
        assert tested["val/accuracy"] == metrics[f"{prefix}accuracy"]
        assert tested["val/loss"] == pytest.approx(metrics[f"{prefix}loss"], rel=1e-6)


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_test_py_ema_without_an_average_is_a_one_line_error(
    reference: dict, tmp_path: Path
) -> None:
    # The recipe's checkpoint without its average: what a run without trainer.ema_decay saves.
    state = load_checkpoint(reference["run_dir"] / "checkpoint-epoch2.pth")
    del state["ema"]
    checkpoint = tmp_path / "plain.pth"
    torch.save(state, checkpoint)
    (tmp_path / "config.json").write_text((reference["run_dir"] / "config.json").read_text())
    result = run_main("test.py", "-r", str(checkpoint), "--ema")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "holds no averaged weights" in result.stderr


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_mid_epoch_stop_then_resume_is_bit_exact_with_every_technique(
    spawn, config_path: Path, reference: dict
) -> None:
    run_dir = config_path.parent / "saved" / RUN / "preempted"
    process = start_training(spawn, config_path, "preempted")
    wait_for_file(process, run_dir / "checkpoint-epoch1.pth")
    time.sleep(0.3)  # into epoch 2
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    saved = sorted_checkpoints(run_dir)[-1]
    assert saved.name.startswith("checkpoint-epoch2-step"), saved

    result = run_main("train.py", "-r", str(saved))
    assert result.returncode == 0, result.stderr
    ours, theirs = run_dir / "checkpoint-epoch2.pth", reference["run_dir"] / "checkpoint-epoch2.pth"
    assert_same_training_state(theirs, ours)
    a, b = load_checkpoint(theirs), load_checkpoint(ours)
    for averaged in ("ema", "lookahead"):  # the average, the slow weights
        for key, value in a[averaged].items():
            assert torch.equal(value, b[averaged][key]), (averaged, key)
    assert a["metrics"]["val/ema_loss"] == b["metrics"]["val/ema_loss"]
    assert a["lr_scheduler"] == b["lr_scheduler"]


def test_every_technique_under_two_process_torchrun(tmp_path: Path) -> None:
    config = recipe_config(tmp_path / "saved", verbosity=2)  # every rank logs its epoch line
    config["data_loader"]["args"].update(num_train=640, validation_split=0.15)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = run_torchrun(
        "--standalone", "--nproc_per_node=2", "train.py", "-c", str(path), "--run-id", "ddp"
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # 2 processes x 32: the global batch is the reference's 64, so the lr is the config's.
    assert "Learning rate(s): 0.05, 0.05: optimizer lr x global batch 64" in result.stdout
    lines = epoch_lines(result.stdout)
    # Both ranks validate the same weights and the same averaged weights on their shards.
    assert lines[0][2] == lines[1][2] and "val/ema_accuracy" in lines[0][2]
    state = load_checkpoint(tmp_path / "saved" / RUN / "ddp" / "checkpoint-epoch2.pth")
    assert int(state["ema"]["n_averaged"]) > 0


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
@pytest.mark.parametrize("name", ["configs/imagenet.json", "configs/imagenet_v1.json"])
def test_imagenet_recipes_train_on_a_tiny_folder(tmp_path: Path, name: str) -> None:
    noise_image_folder(tmp_path / "images")
    overrides = {
        "n_gpu": 0,
        "data_loader.args.data_dir": str(tmp_path / "images"),
        "data_loader.args.validation_split": 6,
        "data_loader.args.image_size": 24,
        "data_loader.args.batch_size": 6,
        "data_loader.args.num_workers": 0,
        "arch.args.name": "resnet18",
        "trainer.epochs": 2,
        "lr_scheduler.warmup_epochs": 1 if name == "configs/imagenet.json" else 0,
        "trainer.save_dir": str(tmp_path / "saved"),
        "trainer.tensorboard": False,
    }
    config = json.loads((ROOT / name).read_text())
    if "eval_image_size" in config["data_loader"]["args"]:
        overrides.update(
            {"data_loader.args.eval_image_size": 32, "data_loader.args.eval_resize_size": 36}
        )
    result = run_main("train.py", "-c", name, "--run-id", "tiny", *set_flags(overrides))
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "saved" / "models" / config["name"] / "tiny"
    assert load_checkpoint(run_dir / "checkpoint-epoch2.pth")["global_step"] == 2 * 3


def test_batch_mixing_without_classes_is_a_one_line_error(
    make_config, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = make_config("configs/denoise.json", batch_mixing={"mixup_alpha": 0.2})
    assert train.main(["-c", str(config)]) == 2  # in-process: a subprocess would import torch
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and "batch_mixing: needs a classifier" in stderr
    assert not (tmp_path / "saved").exists()

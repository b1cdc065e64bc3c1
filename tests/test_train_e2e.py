"""End to end: the real train.py, test.py and new_project.py on shrunk configs.

Real processes: the shared run (train.py), test.py on its test split, and new_project.py with
the copy's own demo and tests. The other runs call main in-process (conftest's run_main): a new
interpreter spends seconds importing torch before train.py does anything."""

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import ROOT, checkpoint_dirs, run_main, run_script
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def logged_epochs(text: str) -> list[int]:
    return [int(number) for number in re.findall(r"epoch (\d+)/\d+  (?!batch )", text)]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One 2-epoch demo run shared by the tests that only read its outputs: a real `python
    train.py` (this file is its end-to-end test)."""
    tmp_path = tmp_path_factory.mktemp("run")
    from conftest import shrink

    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(config))
    result = run_script("train.py", "-c", str(config_path), "--run-id", "first")
    assert result.returncode == 0, result.stderr
    return {"config": config, "save_dir": tmp_path / "saved", "stdout": result.stdout}


def test_outputs_of_a_run(trained_run: dict) -> None:
    save_dir = trained_run["save_dir"]
    run_dir = save_dir / "models" / "Demo_CifarCNN" / "first"
    log_dir = save_dir / "log" / "Demo_CifarCNN" / "first"
    assert sorted(path.name for path in run_dir.iterdir()) == [
        "checkpoint-epoch1.pth",
        "checkpoint-epoch2.pth",
        "config.json",
        "latest",
        "model_best.pth",
    ]
    name, timeline = (run_dir / "latest").read_text().splitlines()
    assert name == "checkpoint-epoch2.pth" and re.fullmatch(r"timeline [0-9a-f]{8}", timeline)
    # The effective config, defaults included, is what the run used.
    saved_config = json.loads((run_dir / "config.json").read_text())
    assert saved_config["trainer"]["epochs"] == 2
    assert saved_config["lr_scheduler"]["interval"] == "epoch"
    assert logged_epochs(trained_run["stdout"]) == [1, 2]

    checkpoint = torch.load(run_dir / "checkpoint-epoch2.pth", weights_only=True)
    assert checkpoint["epoch"] == 2
    assert checkpoint["global_step"] == 2 * 8  # 256 training samples / batch 32, twice
    assert checkpoint["config"] == saved_config
    for key in ("train/loss", "train/accuracy", "val/loss", "val/accuracy", "val/top_k_acc"):
        assert 0 <= checkpoint["metrics"][key] < 10
    assert not any(key.startswith("module.") for key in checkpoint["model"])

    info_log = (log_dir / "info.log").read_text()
    assert "epoch 2/2" in info_log and re.search(r"CifarCNN: [\d,]+ parameters", info_log)
    events = EventAccumulator(str(log_dir)).Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train/loss", "train/step_loss", "val/loss", "val/accuracy", "lr"} <= scalars
    assert {"time/epoch_seconds", "time/train_samples_per_second"} <= scalars
    # The final validation's confusion matrix: classifiers only.
    assert events.Tags()["images"] == ["train/inputs", "val/confusion_matrix"]
    assert [event.step for event in events.Images("val/confusion_matrix")] == [16]
    # One x-axis for every curve, the optimizer step (8 per epoch); the epoch is a curve too.
    assert [event.step for event in events.Scalars("val/accuracy")] == [8, 16]
    assert [(event.step, event.value) for event in events.Scalars("epoch")] == [(8, 1), (16, 2)]
    assert {event.step for event in events.Scalars("train/step_loss")} <= set(range(1, 17))


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_resume_continues_in_the_same_folder(trained_run: dict, tmp_path: Path) -> None:
    import shutil

    save_dir = tmp_path / "saved"
    shutil.copytree(trained_run["save_dir"], save_dir)
    run_dir = save_dir / "models" / "Demo_CifarCNN" / "first"
    # The copied run's config points at the original save_dir: resume writes logs under it,
    # checkpoints beside the checkpoint it resumes from.
    result = run_main("train.py", "-r", str(run_dir / "checkpoint-epoch2.pth"), "--epochs", "3")
    assert result.returncode == 0, result.stderr
    assert logged_epochs(result.stdout) == [3]
    assert (run_dir / "checkpoint-epoch3.pth").is_file()
    assert checkpoint_dirs(save_dir) == [run_dir]  # no new run folder
    checkpoint = torch.load(run_dir / "checkpoint-epoch3.pth", weights_only=True)
    assert checkpoint["epoch"] == 3 and checkpoint["global_step"] == 3 * 8
    assert json.loads((run_dir / "config.json").read_text())["trainer"]["epochs"] == 3


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_test_py_reports_the_validation_accuracy_training_saw(
    trained_run: dict, tmp_path: Path
) -> None:
    run_dir = trained_run["save_dir"] / "models" / "Demo_CifarCNN" / "first"
    best = run_dir / "model_best.pth"
    output = tmp_path / "val.json"
    result = run_main("test.py", "-r", str(best), "--split", "val", "--json", str(output))
    assert result.returncode == 0, result.stderr
    report = json.loads(output.read_text())
    recorded = torch.load(best, weights_only=True)["metrics"]
    assert report["num_samples"] == 64  # 20% of 320
    assert report["metrics"]["val/accuracy"] == recorded["val/accuracy"]
    assert report["metrics"]["val/loss"] == pytest.approx(recorded["val/loss"], rel=1e-6)

    output = tmp_path / "test.json"
    # A real `python test.py` (this file is its end-to-end test).
    result = run_script("test.py", "-r", str(best), "--json", str(output))
    assert result.returncode == 0, result.stderr
    report = json.loads(output.read_text())
    assert report["split"] == "test" and report["num_samples"] == 96
    assert set(report["metrics"]) == {"test/loss", "test/accuracy", "test/top_k_acc"}
    assert len(report["per_class_accuracy"]) == 10
    assert "test/accuracy" in result.stdout and "accuracy of disk" in result.stdout


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_fine_tune_with_a_new_config_starts_a_new_run_at_epoch_1(
    trained_run: dict, make_config
) -> None:
    run_dir = trained_run["save_dir"] / "models" / "Demo_CifarCNN" / "first"
    checkpoint = run_dir / "checkpoint-epoch2.pth"
    # A learning rate so small that the weights stay the checkpoint's (checked below).
    config = make_config(
        **{"optimizer": {"type": "SGD", "args": {"lr": 1e-9}}, "trainer.epochs": 2}
    )
    result = run_main("train.py", "-r", str(checkpoint), "-c", str(config), "--run-id", "tuned")
    assert result.returncode == 0, result.stderr
    assert "its trained weights, in a new run from epoch 1" in result.stdout
    assert logged_epochs(result.stdout) == [1, 2]
    new_run = config.parent / "saved" / "models" / "Demo_CifarCNN" / "tuned"
    assert sorted(path.name for path in new_run.glob("*.pth")) == [
        "checkpoint-epoch1.pth",
        "checkpoint-epoch2.pth",
        "model_best.pth",
    ]
    state = torch.load(new_run / "checkpoint-epoch2.pth", weights_only=True)
    assert state["epoch"] == 2 and state["global_step"] == 2 * 8
    # It started from the checkpoint's weights, not from a new initialisation.
    original = torch.load(checkpoint, weights_only=True)["model"]
    for key in ("features.0.0.weight", "head.weight"):
        torch.testing.assert_close(state["model"][key], original[key], rtol=0, atol=1e-6)


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_fine_tune_with_continue_keeps_the_epoch_count(trained_run: dict, make_config) -> None:
    run_dir = trained_run["save_dir"] / "models" / "Demo_CifarCNN" / "first"
    config = make_config(
        **{"optimizer": {"type": "SGD", "args": {"lr": 0.01, "momentum": 0.9}}, "trainer.epochs": 3}
    )
    result = run_main(
        "train.py", "-r", str(run_dir / "checkpoint-epoch2.pth"), "-c", str(config),
        "--continue", "--run-id", "continued",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "optimizer.type changed (Adam -> SGD)" in result.stdout
    assert logged_epochs(result.stdout) == [3]
    new_run = config.parent / "saved" / "models" / "Demo_CifarCNN" / "continued"
    # The new run's best is its own: its first epoch is the best so far, whatever the old run's.
    assert "the best monitored value starts afresh" in result.stdout
    assert sorted(path.name for path in new_run.glob("*.pth")) == [
        "checkpoint-epoch3.pth",
        "model_best.pth",
    ]


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_iteration_based_epochs_and_save_period(make_config) -> None:
    # 8 batches per pass; len_epoch 13 spans two passes. save_period 2 of 3 epochs: 2 and the last.
    config = make_config(
        **{
            "trainer.len_epoch": 13,
            "trainer.epochs": 3,
            "trainer.save_period": 2,
            "trainer.monitor": "off",
        }
    )
    result = run_main("train.py", "-c", str(config), "--run-id", "iters")
    assert result.returncode == 0, result.stderr
    run_dir = config.parent / "saved" / "models" / "Demo_CifarCNN" / "iters"
    assert sorted(path.name for path in run_dir.glob("*.pth")) == [
        "checkpoint-epoch2.pth",
        "checkpoint-epoch3.pth",
    ]
    assert torch.load(run_dir / "checkpoint-epoch3.pth", weights_only=True)["global_step"] == 3 * 13


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_new_project_copy_runs_its_own_demo_and_tests(tmp_path: Path) -> None:
    if not (ROOT / "new_project.py").is_file():
        pytest.skip("this is a copy made by new_project.py, which leaves itself out")
    target = tmp_path / "MyProject"
    result = run_script("new_project.py", str(target))
    assert result.returncode == 0, result.stderr
    names = {path.name for path in target.iterdir()}
    assert {"train.py", "test.py", "config.json", "configs", "tests", "README.md"} <= names
    assert not {"new_project.py", "copier.yml", ".venv", "data"} & names
    # A git repository of one commit, which records the template's commit for --update.
    assert {".git", ".copier-answers.yml"} <= names
    assert list((target / "saved").iterdir()) == [target / "saved" / ".gitkeep"]
    assert not list(target.rglob("__pycache__"))

    demo = run_script(
        "train.py", "-c", "configs/demo.json", "--epochs", "1", "--run-id", "smoke",
        "--set", "data_loader.args.num_train=320", "--set", "data_loader.args.num_test=64",
        "--set", "arch.args.widths=[8,16]", "--set", "trainer.tensorboard=false",
        cwd=target,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stderr
    assert (target / "saved" / "models" / "Demo_CifarCNN" / "smoke" / "model_best.pth").is_file()
    tests = run_script(
        "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_model.py", cwd=target
    )
    assert tests.returncode == 0, tests.stdout[-2000:]
    assert re.search(r"\d+ passed", tests.stdout)

    again = run_script("new_project.py", str(target))
    assert again.returncode == 2 and "not empty" in again.stderr

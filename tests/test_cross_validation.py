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
from conftest import ROOT, run_main, shrink
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import data_loader.data_loaders as data_module
import train
import utils.state.folds as folds_module
from parse_config import ConfigParser
from utils.distributed.process_group import ProcessInfo
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
        assert values["mean"] == pytest.approx(statistics.fmean(expected))
        assert values["std"] == pytest.approx(statistics.stdev(expected))
    # The same numbers in the run's own log, below the folds' logs.
    info_log = (log_dir / "info.log").read_text()
    mean = summary["metrics"]["val/accuracy"]["mean"]
    assert f"val/accuracy         {mean:.4f} +- " in info_log
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
        "metrics": {"val/loss": {"mean": 0.5, "std": 0.25, "folds": [0.25, 0.75]}},
    }
    assert summary_lines(summary) == [
        "Cross-validation over 2 folds (best epoch of each fold, monitor min val/loss):",
        "  val/loss             0.5000 +- 0.2500  (folds: 0.2500 0.7500)",
    ]


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

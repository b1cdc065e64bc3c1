"""sweep.py: grid, random and Optuna sweeps of real train.py runs on the shrunk demo config.

Bad specs, the space, the summary and the trial environment are checked in-process; the sweeps
themselves run as subprocesses, each trial a real train.py run of one or two tiny epochs.
"""

import csv
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_main, signal_once_saved, wait_for_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sweep
from sweeps.results import summarize
from sweeps.runner import (
    outcome,
    run_trials,
    start_process,
    trial_environment,
    visible_gpus,
)
from sweeps.space import SweepError, Trial, build_space, grid_trials, random_trials
from utils.config.config_checks import read_json
from utils.state.checkpoint import save_checkpoint
from utils.state.folds import RESULT, summarize_folds
from utils.state.run_folder import SUMMARY

NAME = "Demo_CifarCNN"
TINY = {"trainer.epochs": 1, "trainer.tensorboard": False}
TINY.update({"data_loader.args.num_train": 128, "data_loader.args.num_test": 32})


def sweep_dir(config: Path, name: str) -> Path:
    return config.parent / "saved" / "sweeps" / name


def read_summary(folder: Path) -> list[dict]:
    with open(folder / "sweep_summary.csv", newline="") as file:
        return list(csv.DictReader(file))


def best_metric(run_dir: str, key: str = "val/accuracy") -> float:
    return torch.load(Path(run_dir) / "model_best.pth", weights_only=True)["metrics"][key]


def assert_ranked_by_checkpoints(rows: list[dict], num_trials: int) -> None:
    """Every trial finished, ranked 1..N by its model_best.pth's val/accuracy, highest first."""
    assert [row["rank"] for row in rows] == [str(rank) for rank in range(1, num_trials + 1)]
    assert all(row["status"] == "finished" for row in rows), rows
    values = [best_metric(row["run_dir"]) for row in rows]
    assert [float(row["val/accuracy"]) for row in rows] == values
    assert values == sorted(values, reverse=True)


# --- the space and bad specs, in-process ----------------------------------------------------


def space(**flags) -> list:
    empty = dict(grid=[], uniform=[], log_uniform=[], choice=[], num_random=None, num_optuna=None)
    return build_space(**{**empty, **flags})[1]


def test_a_grid_is_every_combination_the_last_varying_fastest():
    dimensions = space(grid=["optimizer.args.lr=[0.1,0.01]", 'arch.args.widths=[[8],[8,16],"x"]'])
    trials = grid_trials(dimensions)
    assert [trial.values for trial in trials[:4]] == [
        {"optimizer.args.lr": 0.1, "arch.args.widths": [8]},
        {"optimizer.args.lr": 0.1, "arch.args.widths": [8, 16]},
        {"optimizer.args.lr": 0.1, "arch.args.widths": "x"},
        {"optimizer.args.lr": 0.01, "arch.args.widths": [8]},
    ]
    assert len(trials) == 6 and trials[5].name == "trial-005"


def test_random_draws_follow_the_seed_and_stay_in_their_ranges():
    dimensions = space(
        uniform=["trainer.x=0.2,0.4"],
        log_uniform=["optimizer.args.lr=1e-5,1e-1"],
        choice=["seed=[1,2,3]"],
        num_random=40,
    )
    trials = random_trials(dimensions, 40, seed=7)
    assert trials == random_trials(dimensions, 40, seed=7)
    assert trials[:3] == random_trials(dimensions, 3, seed=7)  # more trials extend a sweep
    assert trials != random_trials(dimensions, 40, seed=8)
    rates = [trial.values["optimizer.args.lr"] for trial in trials]
    assert all(0.2 <= trial.values["trainer.x"] <= 0.4 for trial in trials)
    assert all(1e-5 <= rate <= 1e-1 for rate in rates)
    assert min(rates) < 1e-3 < max(rates)  # log scale: small rates as likely as large ones
    assert {trial.values["seed"] for trial in trials} == {1, 2, 3}


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-2, 2) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3),
    max_leaves=4,
)


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(JSON_VALUES, min_size=1, max_size=5), kind=st.sampled_from(["grid", "choice"])
)
def test_a_repeated_value_is_refused_and_the_points_left_are_distinct(values, kind):
    """A repeated grid value would run the same trial twice, a repeated choice be drawn twice as
    often: refused in one line; a list that passes gives trials that all differ."""
    text = f"optimizer.args.lr={json.dumps(values)}"
    flags = {kind: [text], **({"num_random": 3} if kind == "choice" else {})}
    repeated = any(
        earlier == value and isinstance(earlier, bool) == isinstance(value, bool)
        for index, value in enumerate(values)
        for earlier in values[:index]
    )
    if repeated:
        with pytest.raises(SweepError, match="is listed twice"):
            space(**flags)
    else:
        points = {json.dumps(trial.values) for trial in grid_trials(space(grid=[text]))}
        assert len(points) == len(values)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    num_trials=st.integers(1, 12),
    seed=st.integers(0, 1000),
)
def test_random_draws_from_choices_alone_never_repeat_a_trial(sizes, num_trials, seed):
    """Every trial trains with the config's seed: two trials with the same values would be one
    run twice. A --choice-only space gives distinct trials, extends with the same first ones,
    and refuses more trials than it has points."""
    choices = [f"k{index}={json.dumps(list(range(size)))}" for index, size in enumerate(sizes)]
    dimensions = space(choice=choices, num_random=num_trials)
    num_points = math.prod(sizes)
    if num_trials > num_points:
        with pytest.raises(SweepError, match=f"only {num_points} distinct trials"):
            random_trials(dimensions, num_trials, seed)
        return
    trials = random_trials(dimensions, num_trials, seed)
    assert len({json.dumps(trial.values) for trial in trials}) == num_trials
    assert [trial.index for trial in trials] == list(range(num_trials))
    assert random_trials(dimensions, num_trials - 1, seed) == trials[:-1]


def test_a_random_sweep_of_two_choices_does_not_draw_a_trial_twice():
    dimensions = space(choice=["optimizer.args.lr=[0.1,0.01]"], num_random=2)
    values = [trial.values["optimizer.args.lr"] for trial in random_trials(dimensions, 2, seed=0)]
    assert sorted(values) == [0.01, 0.1]


def test_a_grid_value_given_twice_is_refused():
    with pytest.raises(SweepError, match=r"--grid 'optimizer.args.lr=\[0.1,0.01,0.1\]': 0.1 is"):
        space(grid=["optimizer.args.lr=[0.1,0.01,0.1]"])


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # one config file for every example: only the flags vary
@given(draw_seed=st.integers(0, 2**31), config_seed=st.integers(0, 1000))
def test_every_trial_trains_with_the_configs_seed_whatever_the_draws_seed(
    make_config, draw_seed, config_seed
):
    """As docs/sweeps.md says: --seed seeds the draws only; each trial's config keeps `seed`."""
    from sweeps.plan import plan

    argv = [
        "-c",
        str(make_config(**TINY)),
        "--seed",
        str(draw_seed),
        "--set",
        f"seed={config_seed}",
    ]
    found = plan(
        sweep.parse_args([*argv, "--random", "3", "--log-uniform", "optimizer.args.lr=1e-4,1e-2"])
    )
    assert {found.parser(trial).config["seed"] for trial in found.trials} == {config_seed}


BAD_SPECS = [
    (["--grid", "optimizer.args.lrr=[0.1]"], "optimizer.args.lrr: not in the config"),
    (["--grid", "optimizer.args.lr=[]"], "expected a non-empty JSON list"),
    (["--grid", "optimizer.args.lr=[0.1,0.1]"], "0.1 is listed twice"),
    (["--random", "2", "--choice", "seed=[1,2,1.0]"], "1.0 is listed twice"),
    (["--random", "2", "--uniform", "optimizer.args.lr=0.1,0.01"], "LOW must be below HIGH"),
    (["--random", "2", "--log-uniform", "optimizer.args.lr=0,1"], "LOW must be > 0"),
    (["--grid", "seed=[1]", "--random", "2", "--choice", "seed=[2]"], "does not mix"),
    (["--grid", "optimizer.args.lr=[0.1,-1]"], "optimizer.args.lr: must be a number > 0, got -1"),
    (["--grid", "seed=[1]", "--set", "trainer.monitor=off"], "a sweep ranks its trials by it"),
    (["--grid", "seed=[1]", "--submit"], "--submit: only with --slurm"),
    (["--grid", "seed=[1,2]", "--trial", "2"], "this sweep has trials 0 to 1"),
    (["--optuna", "2", "--uniform", "optimizer.args.lr=1,2", "--slurm"], "not with --optuna"),
    # Values a trial would not use: its rank is by the base monitor, Optuna saves every epoch.
    (
        ["--grid", 'trainer.monitor=["max val/accuracy","min val/loss"]'],
        "trainer.monitor: the sweep ranks every trial by one metric; set it with --set",
    ),
    (
        ["--optuna", "2", "--choice", "trainer.save_period=[1,2]"],
        "trainer.save_period: --optuna saves every epoch",
    ),
    # One fold of a cross-validation writes no folds_summary.json: its trial had no value.
    (
        [
            *["--set", "data_loader.args.folds=2", "--set", "data_loader.args.fold=0"],
            *["--grid", "data_loader.args.fold=[0,1]"],
        ],
        "data_loader.args.fold: a sweep ranks a cross-validated trial by its value over all",
    ),
    (
        [
            *["--set", "data_loader.args.folds=2", "--set", "data_loader.args.fold=1"],
            *["--grid", "optimizer.args.lr=[0.01]"],
        ],
        "drop fold (keep data_loader.args.folds)",
    ),
    (
        [
            *["--set", "data_loader.args.folds=3", "--random", "2"],
            *["--choice", "data_loader.args.fold=[null,2]", "--set", "data_loader.args.fold=null"],
        ],
        "with data_loader.args.fold=2: data_loader.args.fold: a sweep ranks",
    ),
]


@pytest.mark.parametrize(("flags", "expected"), BAD_SPECS, ids=[e for _, e in BAD_SPECS])
def test_a_bad_spec_is_one_line_before_anything_runs(
    make_config, tmp_path, capsys, flags, expected
):
    config = make_config(**TINY)
    assert sweep.main(["-c", str(config), *flags]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1 and expected in error, error
    assert not (tmp_path / "saved").exists()


def test_a_sweep_folder_that_cannot_be_made_is_one_line(make_config, tmp_path, capsys):
    """trainer.save_dir under a file: exit 2 and one line naming the folder, not a traceback;
    the file is kept."""
    blocker = tmp_path / "a-file"
    blocker.write_text("kept\n")
    config = make_config(**TINY)
    flags = ["--grid", "optimizer.args.lr=[0.1,0.01]", "--set", f"trainer.save_dir={blocker}"]
    assert sweep.main(["-c", str(config), *flags]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1, error
    assert "cannot make the sweep's folder" in error and blocker.read_text() == "kept\n"


def test_optuna_missing_is_named(make_config, capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        "importlib.util.find_spec",
        lambda name, *args: None if name == "optuna" else find_spec(name, *args),
    )
    argv = ["-c", str(make_config(**TINY)), "--optuna", "2", "--uniform", "optimizer.args.lr=1,2"]
    assert sweep.main(argv) == 2
    assert "--optuna: needs the optuna package (pip install optuna)" in capsys.readouterr().err


def test_another_space_under_the_same_name_is_refused(make_config, capsys):
    """--slurm writes sweep.json without running anything: enough to define a sweep."""
    base = ["-c", str(make_config(**TINY)), "--name", "s", "--slurm"]
    drawn = ["--log-uniform", "optimizer.args.lr=1e-4,1e-2"]
    assert sweep.main([*base, "--random", "3", *drawn]) == 0
    assert sweep.main([*base, "--random", "5", *drawn]) == 0  # more trials: the same sweep
    assert sweep.main([*base, "--random", "4", *drawn]) == 2
    assert "this sweep has 5 trials; ask for 5 or more" in capsys.readouterr().err
    assert sweep.main([*base, "--random", "5", "--log-uniform", "optimizer.args.lr=1e-4,1e-1"]) == 2
    assert "this sweep was started with another space; choose another --name" in (
        capsys.readouterr().err
    )
    assert sweep.main([*base, "--random", "5", *drawn, "--set", "trainer.epochs=2"]) == 2
    assert "started with another base config" in capsys.readouterr().err


def test_a_job_array_is_not_written_over_a_sweep_running_here(make_config, capsys):
    """--slurm over the same sweep while a sweep.py runs it: its array tasks would run the
    trials that one runs. Refused in one line, nothing written."""
    from sweeps.results import locked

    config = make_config(**TINY)
    folder = sweep_dir(config, "busy")
    folder.mkdir(parents=True)
    with locked(folder / ".lock", wait=False):  # the sweep.py running it
        argv = ["-c", str(config), "--name", "busy", "--grid", "seed=[1]", "--slurm"]
        assert sweep.main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "another sweep.py is running this sweep" in error, error
    assert not (folder / "sweep.sbatch").exists() and not (folder / "sweep.json").exists()


@pytest.mark.parametrize("wait", [False, True])
def test_a_sweep_lock_the_file_system_cannot_take_is_a_warning(tmp_path, monkeypatch, caplog, wait):
    """flock fails with ENOLCK on NFS or Lustre without locks: the sweep goes on unlocked and
    says so in one line, as train.py's run lock does, rather than stop with a traceback."""
    import errno

    import sweeps.results as results

    def cannot_lock(file: object, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(results.fcntl, "flock", cannot_lock)
    ran = []
    with results.locked(tmp_path / ".lock", wait=wait):
        ran.append(True)
    assert ran == [True]
    assert "cannot lock (No locks available): a second sweep.py on this sweep is not noticed" in (
        caplog.text
    )


def test_the_summary_ranks_finished_trials_and_leaves_the_others_unranked(tmp_path):
    trials = [(Trial(index, {"seed": index}), tmp_path / f"run{index}") for index in range(4)]
    for (trial, run_dir), loss, status in zip(
        trials, [0.5, 0.2, 0.1, 0.3], ["finished", "finished", "failed", "finished"], strict=True
    ):
        run_dir.mkdir()
        state = {"model": {}, "config": {}, "epoch": 2, "metrics": {"val/loss": loss}}
        save_checkpoint(state, run_dir / "model_best.pth")
        record = tmp_path / "trials" / f"{trial.name}.json"
        record.parent.mkdir(exist_ok=True)
        record.write_text(json.dumps({"status": status}))
    rows = summarize(tmp_path, trials, mode="min", key="val/loss")
    assert [(row["rank"], row["trial"], row["value"]) for row in rows] == [
        (1, "trial-001", 0.2),
        (2, "trial-003", 0.3),
        (3, "trial-000", 0.5),
        (None, "trial-002", 0.1),  # failed: its value is shown, not ranked
    ]


SCORES = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.5, 0.25])


@settings(max_examples=30, deadline=None)
@given(
    trials=st.lists(
        st.tuples(SCORES, st.sampled_from(["finished", "failed", "interrupted", "pending"])),
        min_size=1,
        max_size=6,
    ),
    mode=st.sampled_from(["min", "max"]),
)
def test_the_summary_tables_rank_by_the_monitor_mode_and_equal_each_trials_checkpoint(
    tmp_path_factory, trials, mode
):
    """Whatever the scores (ties, NaN, inf) and statuses: the finished trials with a finite
    value come first, in the monitor's order (ties in trial order), the others after them in
    trial order, unranked; and every value in the CSV and JSON, read by column name, is the
    one in that trial's model_best.pth."""
    from sweeps.results import write_summary

    folder = tmp_path_factory.mktemp("sweep")
    pairs = []
    for index, (score, status) in enumerate(trials):
        trial, run_dir = Trial(index, {"optimizer.args.lr": index / 10}), folder / f"run{index}"
        run_dir.mkdir()
        state = {"model": {}, "config": {}, "epoch": 1, "metrics": {"val/loss": score}}
        save_checkpoint(state, run_dir / "model_best.pth")
        if status != "pending":
            (folder / "trials").mkdir(exist_ok=True)
            (folder / "trials" / f"{trial.name}.json").write_text(json.dumps({"status": status}))
        pairs.append((trial, run_dir))
    rows = summarize(folder, pairs, mode=mode, key="val/loss")
    write_summary(folder, rows, monitor=f"{mode} val/loss", key="val/loss")

    rankable = [
        index
        for index, (score, status) in enumerate(trials)
        if status == "finished" and math.isfinite(score)
    ]
    order = sorted(rankable, key=lambda index: trials[index][0] * (-1 if mode == "max" else 1))
    order += [index for index in range(len(trials)) if index not in rankable]
    table = read_summary(folder)
    text = (folder / "sweep_summary.json").read_text()
    listed = read_json(text, "sweep_summary.json")["trials"]  # refuses NaN and Infinity
    assert [row["trial"] for row in table] == [f"trial-{index:03d}" for index in order]
    assert [row["trial"] for row in listed] == [row["trial"] for row in table]
    for row, entry, index in zip(table, listed, order, strict=True):
        expected = best_metric(folder / f"run{index}", "val/loss")
        assert row["rank"] == (str(order.index(index) + 1) if index in rankable else "")
        assert entry["rank"] == (order.index(index) + 1 if index in rankable else None)
        assert row["status"] == trials[index][1]
        value = float(row["val/loss"])
        assert value == expected or (math.isnan(value) and math.isnan(expected))
        # The JSON is strict (json_text): a NaN or inf as null.
        assert entry["value"] == (expected if math.isfinite(expected) else None)
        assert float(row["optimizer.args.lr"]) == index / 10


def test_a_cross_validated_trial_without_a_pooled_value_is_ranked_by_the_folds_mean(tmp_path):
    """A trial of a config with data_loader.args.folds keeps its checkpoints in fold-<i>/ and
    its result in folds_summary.json; results from before pooling (no num_val_samples) leave
    the metric not pooled: the summary ranks it by the folds' mean."""
    trials = [(Trial(index, {"seed": index}), tmp_path / f"run{index}") for index in range(2)]
    for (trial, run_dir), accuracies in zip(trials, [[0.2, 0.4], [0.5, 0.7]], strict=True):
        for fold, accuracy in enumerate(accuracies):
            result = {"fold": fold, "checkpoint": "model_best.pth", "epoch": 1 + fold}
            (run_dir / f"fold-{fold}").mkdir(parents=True)
            (run_dir / f"fold-{fold}" / RESULT).write_text(
                json.dumps({**result, "metrics": {"val/accuracy": accuracy}})
            )
        summary = summarize_folds(run_dir, 2, ("max", "val/accuracy"))
        (run_dir / SUMMARY).write_text(json.dumps(summary))
        (tmp_path / "trials").mkdir(exist_ok=True)
        (tmp_path / "trials" / f"{trial.name}.json").write_text('{"status": "finished"}')
    rows = summarize(tmp_path, trials, mode="max", key="val/accuracy")
    assert [(row["rank"], row["trial"]) for row in rows] == [(1, "trial-001"), (2, "trial-000")]
    assert [row["value"] for row in rows] == pytest.approx([0.6, 0.3])


def test_a_cross_validated_trial_is_ranked_by_its_pooled_value_not_the_folds_mean(tmp_path):
    """Trial 0's folds score 1.0 on 1 sample and 0.0 on 9 (mean 0.5, pooled 0.1); trial 1's
    0.4 on 5 and 5 (both 0.4). Over all their samples trial 1 is the better one."""
    trials = [(Trial(index, {"seed": index}), tmp_path / f"run{index}") for index in range(2)]
    folds = [[(1.0, 1), (0.0, 9)], [(0.4, 5), (0.4, 5)]]
    for (trial, run_dir), trial_folds in zip(trials, folds, strict=True):
        for fold, (accuracy, count) in enumerate(trial_folds):
            result = {"fold": fold, "checkpoint": "model_best.pth", "epoch": 1,
                      "metrics": {"val/accuracy": accuracy}, "num_val_samples": count,
                      "sample_means": ["val/accuracy"], "metric_sums": {}}  # fmt: skip
            (run_dir / f"fold-{fold}").mkdir(parents=True)
            (run_dir / f"fold-{fold}" / RESULT).write_text(json.dumps(result))
        summary = summarize_folds(run_dir, 2, ("max", "val/accuracy"))
        (run_dir / SUMMARY).write_text(json.dumps(summary))
        (tmp_path / "trials").mkdir(exist_ok=True)
        (tmp_path / "trials" / f"{trial.name}.json").write_text('{"status": "finished"}')
    rows = summarize(tmp_path, trials, mode="max", key="val/accuracy")
    assert [(row["rank"], row["trial"]) for row in rows] == [(1, "trial-001"), (2, "trial-000")]
    assert [row["value"] for row in rows] == pytest.approx([0.4, 0.1])


def test_parallel_trials_get_their_own_gpu_and_a_share_of_the_cores():
    def environment(slot: int, **options) -> dict:
        options = {"parallel": 3, "gpus": [], "num_cpus": 8, "environ": {}, **options}
        return trial_environment(slot, **options)

    assert environment(0)["OMP_NUM_THREADS"] == "2"  # 8 cores / 3 trials
    assert environment(0, environ={"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS" not in environment(0, parallel=1)
    gpus = [environment(slot, gpus=["4", "6"])["CUDA_VISIBLE_DEVICES"] for slot in range(3)]
    assert gpus == ["4", "6", "4"]  # more trials than GPUs: they share, round-robin


def test_the_gpus_shared_out_follow_the_device_key(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert visible_gpus("auto", 1, {}) == ["0", "1"]
    assert visible_gpus("cuda", 1, {"CUDA_VISIBLE_DEVICES": "3,5"}) == ["3", "5"]
    assert visible_gpus("auto", 0, {}) == []  # n_gpu 0: the CPU
    assert visible_gpus("cpu", 1, {}) == visible_gpus("cuda:1", 1, {}) == []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert visible_gpus("auto", 1, {}) == []


def test_the_status_of_an_ended_trial():
    assert outcome(0, pruned=False, stopping=False, requeued=False) == "finished"
    assert outcome(1, pruned=False, stopping=False, requeued=False) == "failed"
    assert outcome(143, pruned=False, stopping=False, requeued=False) == "interrupted"
    assert outcome(1, pruned=False, stopping=True, requeued=False) == "interrupted"
    assert outcome(0, pruned=False, stopping=True, requeued=True) == "interrupted"
    assert outcome(143, pruned=True, stopping=False, requeued=False) == "pruned"


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_trial_does_not_outlive_its_sweep(tmp_path, spawn):
    """A sweep killed with SIGKILL takes its trials down (with SIGTERM, so they save)."""
    child_pid = tmp_path / "child.pid"
    code = (
        "import sys, time; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "from sweeps.runner import start_process;"
        "child = start_process([sys.executable, '-c', 'import time; time.sleep(60)'], {},"
        " Path(sys.argv[2]) / 'child.log');"
        # Written then renamed, so the test never reads a file that exists but is still empty.
        "Path(sys.argv[2], 'child.tmp').write_text(str(child.pid));"
        "Path(sys.argv[2], 'child.tmp').rename(Path(sys.argv[2], 'child.pid')); time.sleep(60)"
    )
    parent = spawn([sys.executable, "-c", code, str(ROOT), str(tmp_path)])
    deadline = time.monotonic() + 30
    while not child_pid.exists():
        assert parent.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    pid = int(child_pid.read_text())
    parent.kill()
    parent.wait()
    while running(pid):
        assert time.monotonic() < deadline, "the trial outlived its sweep"
        time.sleep(0.05)


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


# --- real sweeps -----------------------------------------------------------------------------


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_a_grid_runs_two_at_once_ranks_its_trials_and_skips_them_when_run_again(make_config):
    config = make_config(**TINY)
    command = ["sweep.py", "-c", str(config), "--name", "lr", "--parallel", "2"]
    command += ["--set", "data_loader.args.batch_size=16"]
    command += ["--grid", "optimizer.args.lr=[0.03,0.001]", "--grid", "seed=[1,2]"]
    result = run_main(*command)
    assert result.returncode == 0, result.stderr + result.stdout
    folder = sweep_dir(config, "lr")
    rows = read_summary(folder)
    assert_ranked_by_checkpoints(rows, 4)
    # Each trial is an ordinary run whose own config.json holds its values.
    for row in rows:
        run_config = json.loads((Path(row["run_dir"]) / "config.json").read_text())
        assert run_config["optimizer"]["args"]["lr"] == float(row["optimizer.args.lr"])
        assert run_config["seed"] == int(row["seed"])
        assert run_config["data_loader"]["args"]["batch_size"] == 16  # --set, in every trial
        assert Path(row["run_dir"]) == folder / "models" / NAME / row["trial"]
    # Two at once: the second trial started before the first one ended.
    log = (folder / "info.log").read_text()
    assert log.index("trial-001 started") < log.index("trial-000 finished")
    assert json.loads((folder / "sweep.json").read_text())["trials"][3]["values"] == {
        "optimizer.args.lr": 0.001,
        "seed": 2,
    }
    assert "val/accuracy" in result.stdout and "trial-003" in result.stdout  # the top rows

    checkpoints = sorted(folder.glob("models/*/*/*.pth"))
    mtimes = [path.stat().st_mtime_ns for path in checkpoints]
    again = run_main(*command)
    assert again.returncode == 0, again.stderr
    assert "started" not in again.stdout
    assert [path.stat().st_mtime_ns for path in checkpoints] == mtimes
    assert read_summary(folder) == rows


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_a_failed_trial_is_recorded_and_the_sweep_goes_on(make_config):
    config = make_config(**TINY)
    # Six halvings of a 32-pixel image: the model's constructor refuses it when the trial starts.
    widths = "arch.args.widths=[[8,16,32,64,128,256],[8]]"
    result = run_main("sweep.py", "-c", str(config), "--name", "bad", "--grid", widths)
    assert result.returncode == 1, result.stderr
    assert "trial-000 failed (exit code 2): error: " in result.stdout  # the log's console
    assert "too small for 6 blocks" in result.stdout
    rows = read_summary(sweep_dir(config, "bad"))
    assert [(row["rank"], row["trial"], row["status"]) for row in rows] == [
        ("1", "trial-001", "finished"),
        ("", "trial-000", "failed"),
    ]


@pytest.mark.slow  # CI's main job; the floor job runs the fast tests
def test_a_config_edited_while_the_sweep_runs_does_not_reach_its_later_trials(
    make_config, monkeypatch
):
    """sweep.json records the base config the sweep checked, and a resumed sweep refuses
    another: a trial that starts after the file was edited still trains on the recorded one."""
    config = make_config(**TINY)
    start = sweep.TrialStarter.start

    def edit_then_start(self, trial, slot):
        if trial.index == 1:  # the user edits the file while trial-000 trains
            edited = json.loads(config.read_text())
            edited["data_loader"]["args"]["batch_size"] = 16
            config.write_text(json.dumps(edited))
        return start(self, trial, slot)

    monkeypatch.setattr(sweep.TrialStarter, "start", edit_then_start)
    result = run_main("sweep.py", "-c", str(config), "--name", "e", "--grid", "seed=[0,1]")
    assert result.returncode == 0, result.stderr + result.stdout
    folder = sweep_dir(config, "e")
    recorded = json.loads((folder / "sweep.json").read_text())["definition"]["base config"]
    for row in read_summary(folder):
        run_config = json.loads((Path(row["run_dir"]) / "config.json").read_text())
        assert run_config["data_loader"] == recorded["data_loader"], row["trial"]


def test_a_failed_trial_is_reported_by_its_own_output_not_an_earlier_runs(make_config, tmp_path):
    """A trial's log is appended to when it runs again: the reason logged for its failure comes
    from this run's output (here none: it dies at start-up), not from an earlier run's error."""
    config = make_config(**TINY)
    log = sweep_dir(config, "again") / "trials" / "trial-000.log"
    log.parent.mkdir(parents=True)
    log.write_text("error: the reason an earlier run failed\n")
    dies = tmp_path / "dies"  # every trial's interpreter exits at once, without a word
    dies.mkdir()
    (dies / "sitecustomize.py").write_text("import os\nos._exit(3)\n")
    result = run_main(
        "sweep.py", "-c", str(config), "--name", "again", "--grid", "seed=[1]",
        env={"PYTHONPATH": str(dies)},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr + result.stdout
    assert "trial-000 failed (exit code 3): (no output)" in result.stdout


def test_a_sweep_rerun_at_once_waits_for_its_killed_runs_trial_to_save(make_config):
    """A sweep killed with SIGKILL leaves its trial saving a checkpoint (SIGTERM from the parent
    death signal) and holding its run folder's lock for a moment: the same command run again at
    once waits for it, then resumes the trial, rather than fail it as "in use"."""
    import threading

    from utils.state.run_lock import held

    config = make_config(**TINY)
    folder = sweep_dir(config, "stale")
    run_dir = folder / "models" / NAME / "trial-000"
    run_dir.mkdir(parents=True)
    taken, done = threading.Event(), threading.Event()

    def said(path: Path, text: str) -> bool:
        return path.is_file() and text in path.read_text(errors="replace")

    def saving() -> None:  # the killed sweep's trial, saving until the sweep waits or fails
        with held(run_dir, shared=False):
            taken.set()
            while not done.is_set() and not (
                said(folder / "info.log", "held by another process")
                or said(folder / "trials" / "trial-000.log", "in use by another process")
            ):
                time.sleep(0.1)

    thread = threading.Thread(target=saving)
    thread.start()
    taken.wait()
    try:
        result = run_main("sweep.py", "-c", str(config), "--name", "stale", "--grid", "seed=[1]")
    finally:
        done.set()
        thread.join()
    assert result.returncode == 0, result.stderr + result.stdout
    assert "trial-000: its run folder is held by another process" in result.stdout
    assert_ranked_by_checkpoints(read_summary(folder), 1)


@pytest.mark.slow
def test_a_sweep_killed_mid_trial_and_run_again_at_once_resumes_that_trial_once(make_config, spawn):
    """SIGKILL, then the same command at once: the killed sweep's trial saves on its parent
    death signal, and the new sweep resumes it (waiting for it if need be) and runs the next;
    the summary lists each trial once, finished."""
    config = make_config(**{**TINY, "trainer.epochs": 2, "trainer.len_epoch": 30})
    command = [sys.executable, "sweep.py", "-c", str(config), "--name", "kill", "--grid"]
    command += ["seed=[1,2]"]
    folder = sweep_dir(config, "kill")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    first = spawn(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    wait_for_file(first, folder / "models" / NAME / "trial-000" / "checkpoint-epoch1.pth")
    first.kill()
    first.wait()
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Resumed from" in (folder / "trials" / "trial-000.log").read_text()
    assert_ranked_by_checkpoints(read_summary(folder), 2)


def test_a_trial_killed_by_a_signal_is_reported_as_killed(make_config, tmp_path):
    """A trial killed by a signal (the OOM killer's SIGKILL) printed no `error:` line, and its
    last line ("Outputs: ...", or an earlier run's) is not why it failed: the signal is."""
    config = make_config(**TINY)
    log = sweep_dir(config, "killed") / "trials" / "trial-000.log"
    log.parent.mkdir(parents=True)
    log.write_text("error: the reason an earlier run failed\n")
    killed = tmp_path / "killed"  # every trial's interpreter prints a line, then is killed
    killed.mkdir()
    (killed / "sitecustomize.py").write_text(
        "import os, signal\nprint('Outputs: here', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = run_main(
        "sweep.py", "-c", str(config), "--name", "killed", "--grid", "seed=[1]",
        env={"PYTHONPATH": str(killed)},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr + result.stdout
    assert "trial-000 failed (exit code -9): killed by SIGKILL (out of memory?)" in result.stdout


def write_tool(folder: Path, name: str, body: str) -> None:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


@pytest.fixture
def slurm_array(make_config, tmp_path) -> tuple[Path, dict]:
    """A 2-trial grid written as a job array and submitted to a fake sbatch; the folder of the
    sweep and the environment of a machine whose sbatch and scontrol log their arguments."""
    config = make_config(**{**TINY, "trainer.epochs": 2, "trainer.len_epoch": 40})
    tools, calls = tmp_path / "bin", tmp_path / "calls.log"
    write_tool(tools, "sbatch", f'echo "sbatch $*" >> {calls}\necho "Submitted batch job 77"\n')
    write_tool(tools, "scontrol", f'echo "scontrol $*" >> {calls}\n')
    env = {"PATH": f"{tools}:{os.environ['PATH']}"}
    grid = ["--grid", "optimizer.args.lr=[0.01,0.001]", "--parallel", "2"]
    result = run_main(
        "sweep.py", "-c", str(config), "--name", "array", *grid, "--slurm", "--submit", env=env
    )
    assert result.returncode == 0, result.stderr
    folder = sweep_dir(config, "array")
    assert "Submitted batch job 77" in result.stdout
    assert calls.read_text() == f"sbatch {folder / 'sweep.sbatch'}\n"
    assert not (folder / "models").exists()  # nothing ran here
    return folder, {**env, "SLURM_ARRAY_JOB_ID": "77", "CALLS": str(calls)}


def test_slurm_writes_and_submits_a_job_array(slurm_array):
    folder, _ = slurm_array
    script = (folder / "sweep.sbatch").read_text()
    assert "#SBATCH --array=0-1%2\n" in script  # 2 trials, at most 2 at once
    assert "#SBATCH --signal=B:USR1@120\n" in script and "#SBATCH --requeue\n" in script
    assert '--trial "$SLURM_ARRAY_TASK_ID" --requeue-file "$requeue_file"' in script
    assert "--grid 'optimizer.args.lr=[0.01,0.001]'" in script


@pytest.mark.slow
def test_an_array_task_runs_its_trial_and_requeues_at_the_time_limit(slurm_array, spawn):
    folder, env = slurm_array
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env, "SLURM_ARRAY_TASK_ID": "1"}
    run_dir = folder / "models" / NAME / "trial-001"
    task = spawn(
        ["bash", str(folder / "sweep.sbatch")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = signal_once_saved(task, run_dir / "checkpoint-epoch1.pth")  # as SLURM would
    assert task.returncode == 0, output
    assert Path(env["CALLS"]).read_text().splitlines()[-1] == "scontrol requeue 77_1"
    assert json.loads((folder / "trials" / "trial-001.json").read_text())["status"] == "interrupted"

    # The requeued task resumes its trial and finishes it; trial 0 has not run.
    again = subprocess.run(
        ["bash", str(folder / "sweep.sbatch")], env=env, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Resumed from" in (folder / "trials" / "trial-001.log").read_text()
    rows = read_summary(folder)
    assert [(row["trial"], row["status"]) for row in rows] == [
        ("trial-001", "finished"),
        ("trial-000", "pending"),
    ]


# SLURM's SIGUSR1 reaching the batch shell (which passes it on to sweep.py) while sweep.py plans
# the sweep (imports, checks the config) or writes the summary: outside any trial.
SIGNAL_OUTSIDE_A_TRIAL = """import os, signal, sys, time
sys.path.insert(0, {root!r})
import {module} as module

def signalled(*args, **kwargs):
    os.kill(os.getppid(), signal.SIGUSR1)
    time.sleep(2)  # the shell's trap passes it on to sweep.py meanwhile
    return original(*args, **kwargs)

original, module.{function} = module.{function}, signalled
"""


@pytest.mark.parametrize(
    "module, function, status, requeued",
    [
        ("sweeps.plan", "plan", "pending", True),  # the trial has not run: the task requeues
        pytest.param(  # the trial has finished: the summary is written, nothing to requeue
            "sweeps.results", "write_summary", "finished", False, marks=pytest.mark.slow
        ),
    ],
)
def test_an_array_tasks_signal_outside_its_trial_requeues_it_or_lets_it_end(
    slurm_array, tmp_path, module, function, status, requeued
):
    folder, env = slurm_array
    hook = tmp_path / "hook"
    hook.mkdir()
    code = SIGNAL_OUTSIDE_A_TRIAL.format(root=str(ROOT), module=module, function=function)
    (hook / "sitecustomize.py").write_text(code)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env, "SLURM_ARRAY_TASK_ID": "1"}
    env["PYTHONPATH"] = str(hook)
    task = subprocess.run(
        ["bash", str(folder / "sweep.sbatch")], env=env, capture_output=True, text=True, timeout=120
    )
    output = task.stdout + task.stderr
    assert task.returncode == 0, output  # not 138: sweep.py no longer dies of the signal
    calls = Path(env["CALLS"]).read_text().splitlines()
    assert (calls[-1] == "scontrol requeue 77_1") is requeued, calls
    rows = {row["trial"]: row["status"] for row in read_summary(folder)}
    assert rows == {"trial-001": status, "trial-000": "pending"}, output
    assert not list(folder.glob("requeue-*"))  # the shell removed it once it requeued


def test_an_array_tasks_signal_before_python_holds_it_requeues_the_task(slurm_array, tmp_path):
    """SIGUSR1 while sweep.py's interpreter starts (before main() holds it) kills it with
    128 + USR1: the batch shell, which passed the signal on, requeues the task instead of
    ending it with that code (SLURM does not requeue a task that failed)."""
    folder, env = slurm_array
    hook = tmp_path / "hook"
    hook.mkdir()
    # Python imports sitecustomize at startup, before sweep.py's first line.
    code = "import os, signal, time\nos.kill(os.getppid(), signal.SIGUSR1)\ntime.sleep(5)\n"
    (hook / "sitecustomize.py").write_text(code)
    env = {**os.environ, **env, "SLURM_ARRAY_TASK_ID": "1", "PYTHONPATH": str(hook)}
    task = subprocess.run(
        ["bash", str(folder / "sweep.sbatch")], env=env, capture_output=True, text=True, timeout=60
    )
    output = task.stdout + task.stderr
    assert task.returncode == 0, output
    assert "requeueing task 77_1" in task.stdout, output
    assert Path(env["CALLS"]).read_text().splitlines()[-1] == "scontrol requeue 77_1"
    assert not (folder / "models").exists()  # no trial started


@pytest.mark.slow
def test_a_stopped_random_sweep_resumes_without_running_finished_trials_again(make_config, spawn):
    config = make_config(**{**TINY, "trainer.epochs": 3, "trainer.len_epoch": 30})
    command = [sys.executable, "sweep.py", "-c", str(config), "--name", "drawn", "--random", "3"]
    command += ["--log-uniform", "optimizer.args.lr=1e-4,1e-1", "--choice", "seed=[1,2]"]
    folder = sweep_dir(config, "drawn")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    first = spawn(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    second_run = folder / "models" / NAME / "trial-001"
    wait_for_file(first, second_run / "checkpoint-epoch1.pth")
    first.send_signal(signal.SIGTERM)  # passed on to trial 1, which saves and stops
    output = first.communicate(timeout=60)[0]
    assert first.returncode == 128 + signal.SIGTERM, output
    statuses = [row["status"] for row in read_summary(folder)]
    assert statuses == ["finished", "interrupted", "pending"], output

    finished = folder / "models" / NAME / "trial-000"
    mtimes = {path: path.stat().st_mtime_ns for path in finished.iterdir()}
    log = (folder / "trials" / "trial-000.log").read_text()
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "trial-000 started" not in again.stdout
    assert {path: path.stat().st_mtime_ns for path in finished.iterdir()} == mtimes
    assert (folder / "trials" / "trial-000.log").read_text() == log
    assert "Resumed from" in (folder / "trials" / "trial-001.log").read_text()
    assert_ranked_by_checkpoints(read_summary(folder), 3)


@pytest.mark.slow
@pytest.mark.parametrize("folds", [0, 2])
def test_pruning_stops_a_trial_after_the_epoch_that_was_pruned(make_config, tmp_path, folds):
    """With data_loader.args.folds a trial keeps its checkpoints in fold-<i>/: the epochs of
    fold 0 (the first to train, on the same split in every trial) are reported, and a pruned
    trial stops there, before the other folds."""
    config = make_config(**{**TINY, "trainer.epochs": 3, "trainer.len_epoch": 30})
    run_dir = tmp_path / "saved" / "models" / NAME / "pruned"
    command = [sys.executable, str(ROOT / "train.py"), "-c", str(config), "--run-id", "pruned"]
    command += ["--folds", str(folds)] if folds else []
    trials, seen, ended = iter([Trial(0, {})]), [], []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def start(trial: Trial, slot: int) -> tuple[subprocess.Popen, Path]:
        return start_process(command, env, tmp_path / "trial.log"), run_dir

    def on_epoch(trial: Trial, epoch: int, metrics: dict) -> bool:
        seen.append((epoch, metrics["val/accuracy"]))
        return True  # prune at the first epoch reported

    def finish(trial: Trial, status: str, code: int, seconds: float) -> None:
        ended.append((status, code))

    stopped = run_trials(lambda: next(trials, None), start, finish, parallel=1, on_epoch=on_epoch)
    assert stopped is None
    assert ended == [("pruned", 128 + signal.SIGTERM)], (tmp_path / "trial.log").read_text()
    checkpoints = run_dir / "fold-0" if folds else run_dir
    first = torch.load(checkpoints / "checkpoint-epoch1.pth", weights_only=True)
    assert seen == [(1, first["metrics"]["val/accuracy"])]
    assert not (checkpoints / "checkpoint-epoch3.pth").exists()
    assert not (run_dir / "fold-1").exists()


@pytest.mark.slow
def test_optuna_reports_every_epoch_and_ranks_its_trials(make_config):
    optuna = pytest.importorskip("optuna")
    config = make_config(**{**TINY, "trainer.epochs": 2})
    command = ["sweep.py", "-c", str(config), "--name", "tpe", "--optuna", "3"]
    command += [
        "--log-uniform",
        "optimizer.args.lr=1e-4,1e-1",
        "--choice",
        "arch.args.widths=[[8],[8,16]]",
    ]
    result = run_main(*command)
    assert result.returncode == 0, result.stderr + result.stdout
    folder = sweep_dir(config, "tpe")
    rows = read_summary(folder)
    assert_ranked_by_checkpoints(rows, 3)
    study = optuna.load_study(study_name="tpe", storage=f"sqlite:///{folder / 'optuna.db'}")
    for trial in study.trials:
        run_dir = folder / "models" / NAME / f"trial-{trial.number:03d}"
        epochs = [
            torch.load(run_dir / f"checkpoint-epoch{epoch}.pth", weights_only=True)
            for epoch in (1, 2)
        ]
        assert trial.intermediate_values == {
            epoch: state["metrics"]["val/accuracy"]
            for epoch, state in zip((1, 2), epochs, strict=True)
        }
        assert trial.value == best_metric(str(run_dir))
        run_config = json.loads((run_dir / "config.json").read_text())
        assert json.dumps(run_config["arch"]["args"]["widths"]) == trial.params["arch.args.widths"]


@pytest.mark.parametrize("mode", ["min", "max"])
def test_optuna_prunes_and_picks_its_best_by_the_monitors_mode(make_config, mode):
    """In-process, no training: five trials report epoch 1 and finish; a sixth whose epoch 1 is
    worse than their median (higher for min, lower for max) is pruned, a better one is not; and
    the study's best trial is the table's rank 1, by the same mode."""
    pytest.importorskip("optuna")
    from sweeps.optuna_search import OptunaTrials
    from sweeps.plan import plan

    config = make_config(**{**TINY, "trainer.monitor": f"{mode} val/loss"})
    argv = ["-c", str(config), "--optuna", "7", "--uniform", "optimizer.args.lr=0.001,0.01"]
    found = plan(sweep.parse_args(argv))
    found.sweep_dir.mkdir(parents=True)
    study = OptunaTrials(found)
    scores = [0.3, 0.1, 0.5, 0.2, 0.4]
    for score in scores:
        trial = study.next_trial()
        assert not study.on_epoch(trial, 1, {"val/loss": score})
        study.finish(trial, "finished", score)
    worse, better = (0.9, 0.05) if mode == "min" else (0.05, 0.9)
    trial = study.next_trial()
    assert study.on_epoch(trial, 1, {"val/loss": worse})  # pruned
    study.finish(trial, "pruned", None)
    trial = study.next_trial()
    assert not study.on_epoch(trial, 1, {"val/loss": better})
    best = (min if mode == "min" else max)(range(len(scores)), key=scores.__getitem__)
    assert study.study.best_trial.number == best


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    num_seeds=st.integers(1, 3),
    num_rates=st.integers(1, 2),
    extra=st.integers(0, 4),
    seed=st.integers(0, 2**16),
)
def test_optuna_never_trains_the_same_point_twice_and_reuses_its_result(
    make_config, num_seeds, num_rates, extra, seed
):
    """A space of choices has few points and TPE asks for them again: a repeat would train the
    same run again (every trial has the config's seed). In-process, no training: the trials
    handed out are distinct, a repeat gets the earlier trial's value in the study, and the
    study still ends at N trials (so a space used up ends the sweep)."""
    optuna = pytest.importorskip("optuna")
    from sweeps.optuna_search import OptunaTrials
    from sweeps.plan import plan

    config = make_config(**TINY)
    seeds, rates = list(range(1, num_seeds + 1)), [0.01, 0.001][:num_rates]
    size = num_seeds * num_rates
    # A study of its own in each example (tmp_path is the same for all of them).
    argv = ["-c", str(config), "--name", f"choices-{os.urandom(4).hex()}"]
    argv += ["--optuna", str(size + extra), "--seed", str(seed)]
    argv += ["--choice", f"seed={json.dumps(seeds)}", "--choice", f"optimizer.args.lr={rates}"]
    found = plan(sweep.parse_args(argv))
    found.sweep_dir.mkdir(parents=True, exist_ok=True)
    study = OptunaTrials(found)
    ran: list[tuple] = []

    def score(values: dict) -> float:  # what training at these values would give, every time
        return values["seed"] + values["optimizer.args.lr"]

    while (trial := study.next_trial()) is not None:
        ran.append(tuple(sorted(trial.values.items())))
        study.finish(trial, "finished", score(trial.values))
    assert len(ran) == len(set(ran)) <= size
    frozen = study.study.trials
    assert len(frozen) == size + extra
    values = {trial.number: study._decode(trial.params) for trial in frozen}
    assert all(trial.value == score(values[trial.number]) for trial in frozen)
    assert all(trial.state == optuna.trial.TrialState.COMPLETE for trial in frozen)
    assert [trial.index for trial in study.trials()] == [
        trial.number for trial in frozen if "repeats" not in trial.user_attrs
    ]
    assert len(study.trials()) == len(ran)


def test_a_resumed_optuna_study_continues_its_trial_and_draws_new_values(make_config, tmp_path):
    pytest.importorskip("optuna")
    from parse_config import with_defaults
    from sweeps.optuna_search import OptunaTrials
    from sweeps.plan import Sweep

    dimensions = space(log_uniform=["optimizer.args.lr=1e-4,1e-1"], num_optuna=3)
    base = with_defaults(json.loads(make_config(**TINY).read_text()))
    study = Sweep(name="tpe", sweep_dir=tmp_path, method="optuna", dimensions=dimensions,
                  trials=[], num_trials=3, seed=0, base=base, monitor="max val/accuracy",
                  mode="max", key="val/accuracy")  # fmt: skip
    first = OptunaTrials(study)
    done, stopped = first.next_trial(), first.next_trial()
    assert first.on_epoch(done, 1, {"val/accuracy": 0.5}) is False  # no pruning this early
    first.finish(done, "finished", 0.5)
    first.finish(stopped, "interrupted", None)

    # The next run of the sweep: the interrupted trial first, with its values, then a new one.
    again = OptunaTrials(study)
    assert again.next_trial() == stopped
    new = again.next_trial()
    assert new.index == 2 and new.values not in (done.values, stopped.values)
    assert again.next_trial() is None  # the study has its 3 trials
    assert [trial.state.name for trial in again.study.trials] == ["COMPLETE", "RUNNING", "RUNNING"]
    assert again.study.trials[0].intermediate_values == {1: 0.5}


def test_optuna_values_the_config_refuses_fail_that_trial_and_the_sweep_goes_on(make_config):
    """Only the ends of an Optuna range are checked before the sweep starts: a value between
    them that the config refuses (here a warmup of 0.45 epochs for a schedule that steps once
    per epoch) fails its trial, without starting it, and the study goes on; the next run of
    the sweep does not take the refused trial up again."""
    pytest.importorskip("optuna")
    import optuna

    config = make_config(**TINY)
    command = ["sweep.py", "-c", str(config), "--name", "w", "--optuna", "2"]
    command += ["--uniform", "lr_scheduler.warmup_epochs=0,2"]  # whole numbers only
    first = run_main(*command)
    assert first.returncode == 1, first.stderr + first.stdout
    assert "must be a whole number of epochs" in first.stdout and not first.stderr
    assert "trial-000 started" not in first.stdout
    folder = sweep_dir(config, "w")
    study = optuna.load_study(study_name="w", storage=f"sqlite:///{folder / 'optuna.db'}")
    assert [trial.state.name for trial in study.trials] == ["FAIL", "FAIL"]
    again = run_main(*command)
    assert again.returncode == 0, again.stderr + again.stdout
    assert (folder / "sweep_summary.csv").is_file()


@pytest.mark.slow
def test_a_sweep_killed_while_recording_a_trial_neither_loses_nor_fakes_it(
    make_config, monkeypatch
):
    """Stopped between the two records of an ended trial (the study's and trials/*.json), in
    whichever order they are written: the next run of the same command reports the trial as
    finished and ranks it, never as pending (unranked for good) or done when it is not."""
    optuna = pytest.importorskip("optuna")
    import sweeps.optuna_search as optuna_search
    import sweeps.results as results

    config = make_config(**TINY)
    command = ["-c", str(config), "--name", "k", "--optuna", "1"]
    command += ["--log-uniform", "optimizer.args.lr=1e-3,1e-2"]
    calls = []

    def second_write_is_killed(write):
        def wrapped(*args, **kwargs):
            calls.append(write.__name__)
            if len(calls) == 2:
                raise KeyboardInterrupt  # as a kill here: the first write done, not the second
            return write(*args, **kwargs)

        return wrapped

    with monkeypatch.context() as patches:
        patches.setattr(results, "write_record", second_write_is_killed(results.write_record))
        finish = optuna_search.OptunaTrials.finish
        patches.setattr(optuna_search.OptunaTrials, "finish", second_write_is_killed(finish))
        assert sweep.main(command) == 130
    assert len(calls) == 2
    assert sweep.main(command) == 0
    folder = sweep_dir(config, "k")
    assert_ranked_by_checkpoints(read_summary(folder), 1)
    study = optuna.load_study(study_name="k", storage=f"sqlite:///{folder / 'optuna.db'}")
    assert [trial.state.name for trial in study.trials] == ["COMPLETE"]

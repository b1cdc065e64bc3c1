"""tune.py --lr-range (issue 35): the suggestion rule on problems whose good learning rates are
known, the range test through the engine restoring every state it touched, and the command end
to end (its files, its --set line, its refusal to touch an existing folder)."""

import argparse
import contextlib
import csv
import importlib.util
import itertools
import json
import logging
import math
import re
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import NUM_EXAMPLES, ROOT, run_script, shrink, without_muon, write_shrunk
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image

from base.tuning import largest_fitting, lr_range_test
from build import build_trainer
from parse_config import ConfigParser
from utils.distributed.process_group import process_info
from utils.optim.lr_range import geometric, run_range_test
from utils.util import get_rng_state


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_the_suggestion_is_a_good_rate_of_gradient_descent_on_a_quadratic(num_examples):
    """Gradient descent on sum(c_i w_i^2) / 2 converges for lr < 2 / max(c), fastest near
    1 / max(c): whatever the scale, the spread of curvatures and some noise in the losses, the
    suggestion lies in [0.2, 2) / max(c)."""

    @settings(max_examples=num_examples)
    @given(
        log_top=st.floats(-2, 3), log_spread=st.floats(1, 3), noise=st.floats(0, 0.02),
        seed=st.integers(0, 2**16),
    )  # fmt: skip
    def check(log_top: float, log_spread: float, noise: float, seed: int) -> None:
        top = 10**log_top
        curvatures = torch.logspace(log_top - log_spread, log_top, 30, dtype=torch.float64)
        weights = torch.ones(30, dtype=torch.float64)
        generator = torch.Generator().manual_seed(seed)

        def step(lr: float) -> float:
            nonlocal weights
            loss = float(0.5 * (curvatures * weights**2).sum())
            weights = weights - lr * curvatures * weights
            return loss * (1 + noise * float(torch.randn((), generator=generator)))

        result = run_range_test(step, geometric(1e-5 / top, 100 / top, 100))
        assert result.stopped in ("diverged", "not finite")  # it went past 2 / max(c)
        assert result.suggestion is not None and 0.2 <= result.suggestion * top < 2

    check()


def test_a_flat_curve_suggests_nothing():
    result = run_range_test(lambda lr: 1.0, geometric(1e-6, 1.0, 50))
    assert result.suggestion is None and result.stopped == "done"


def demo_config(tmp_path: Path) -> Path:
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["trainer"]["tensorboard"] = False
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_the_range_test_trains_at_each_rate_and_restores_every_state(tmp_path: Path):
    config = ConfigParser.from_args(argparse.Namespace(config=str(demo_config(tmp_path))))
    device = torch.device("cpu")
    trainer = build_trainer(config, process_info(), device, logging.getLogger("test"))
    before = {
        "model": {k: v.clone() for k, v in trainer.model.state_dict().items()},
        "optimizer": repr(trainer.optimizer.state_dict()),
        "rng": get_rng_state(device),
    }
    rates, seen = geometric(1e-4, 1.0, 6), []
    trainer.optimizer.register_step_pre_hook(
        lambda optimizer, *_: seen.append(optimizer.param_groups[0]["lr"])
    )
    moved = []
    trainer.optimizer.register_step_post_hook(
        lambda *_: moved.append(trainer.model.state_dict()["features.0.0.weight"].clone())
    )
    result = lr_range_test(trainer, rates)
    assert seen == pytest.approx(rates[: len(seen)]) and len(seen) == len(result.lrs) >= 3
    assert not torch.equal(moved[-1], before["model"]["features.0.0.weight"])  # it trained
    for key, value in trainer.model.state_dict().items():
        assert torch.equal(value, before["model"][key]), key
    assert repr(trainer.optimizer.state_dict()) == before["optimizer"]
    after = get_rng_state(device)
    assert torch.equal(after["torch"], before["rng"]["torch"])
    assert after["python"] == before["rng"]["python"]


def test_tune_py_writes_the_curve_and_prints_the_set_line(tmp_path: Path):
    config = demo_config(tmp_path)
    command = [sys.executable, "tune.py", "-c", str(config), "--lr-range", "--steps", "12",
               "--min-lr", "1e-5", "--max-lr", "10", "--run-id", "lr"]  # fmt: skip
    env = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "saved" / "log" / "Demo_CifarCNN" / "lr"
    with (out / "lr_range.csv").open() as file:
        rows = list(csv.DictReader(file))
    rates = [float(row["lr"]) for row in rows]
    assert 3 <= len(rows) <= 12 and rates == sorted(rates) and rates[0] == pytest.approx(1e-5)
    assert all(math.isfinite(float(row["loss"])) for row in rows)
    assert Image.open(out / "lr_range.png").size == (640, 400)
    assert list(out.glob("events.out.tfevents.*"))
    # Nothing anywhere else: no checkpoint folder, no other run's log.
    written = {path.parent for path in (tmp_path / "saved").rglob("*") if path.is_file()}
    assert written == {out}, written
    lines = [line for line in result.stdout.splitlines() if "--set optimizer.args.lr=" in line]
    assert len(lines) == 1 or "No descent of the loss" in result.stdout + result.stderr
    # Again into the same folder: refused in one line, the first test's files kept.
    kept = {path.name: path.read_bytes() for path in out.iterdir()}
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert again.returncode == 2 and again.stderr.strip().endswith("choose another --run-id")
    assert {path.name: path.read_bytes() for path in out.iterdir()} == kept


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_the_search_finds_the_largest_size_that_fits_in_few_tries(num_examples):
    """Whatever the true limit, the start and the cap: the answer is the largest size that fits
    (None when nothing does), in at most about 2 log2 tries."""

    @settings(max_examples=num_examples)
    @given(fits_up_to=st.integers(0, 5000), start=st.integers(1, 2000), cap=st.integers(1, 9000))
    def check(fits_up_to: int, start: int, cap: int) -> None:
        tried = []

        def fits(size: int) -> bool:
            tried.append(size)
            return size <= fits_up_to

        found = largest_fitting(fits, start, cap)
        expected = min(fits_up_to, cap)
        assert found == (expected or None)
        assert len(tried) <= 2 * math.log2(max(cap, 2)) + 3

    check()


PEAKS = """
import argparse, itertools, logging, sys, torch
from base.tuning import peak_memory, restored, tiled, train_step
from build import build_trainer
from parse_config import ConfigParser
from utils.distributed.process_group import process_info
config = ConfigParser.from_args(argparse.Namespace(config=sys.argv[1]))
trainer = build_trainer(config, process_info(), torch.device("cpu"), logging.getLogger("t"))
trainer.check_first_batch()
samples = list(itertools.islice(trainer.train_loader, 4))
for size in map(int, sys.argv[2:]):
    with restored(trainer), peak_memory(trainer.device) as peak:
        train_step(trainer, [tiled(samples, size)])
    print(peak())
"""


@pytest.mark.slow  # three processes that import torch
def test_tune_py_batch_size_answers_a_batch_that_fits_the_budget_and_whose_double_does_not(
    tmp_path: Path,
):
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("the CPU's peak memory is read from Linux's /proc")
    config = demo_config(tmp_path)
    # 960 training samples: more than the answer's double, which a pass must hold to be a batch.
    settings_ = json.loads(config.read_text())
    settings_["data_loader"]["args"]["num_train"] = 1200
    config.write_text(json.dumps(settings_))
    env = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    budget = 1.0  # GiB: the demo's process holds about 0.6 at rest, 1.1 with a batch of 512
    result = subprocess.run(
        [sys.executable, "tune.py", "-c", str(config), "--batch-size", "--max-memory", str(budget)],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [
        line for line in result.stdout.splitlines() if "--set data_loader.args.batch_size=" in line
    ]
    size = int(line.split("=")[1])
    assert "--set optimizer.args.lr=" in result.stdout  # the demo has no reference_batch_size
    peaks = subprocess.run(
        [sys.executable, "-c", PEAKS, str(config), str(size), str(2 * size)],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert peaks.returncode == 0, peaks.stderr[-3000:]
    fitting, double = map(int, peaks.stdout.split())
    # Measured again in another process: each side within 2 %, what one measurement varies by
    # (CI saw the double at 1.015 GiB here where tune.py's own measurement had it over 1).
    assert fitting <= budget * 2**30 * 1.02 and double > budget * 2**30 * 0.98, (fitting, double)


def test_tune_py_batch_size_on_the_cpu_needs_a_budget(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "tune.py", "-c", str(demo_config(tmp_path)), "--batch-size"],
        cwd=ROOT, env={"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2 and result.stderr.strip().endswith("--max-memory GIB")


def group_rates(config: Path, sets: list[str]) -> list[float]:
    """Each parameter group's learning rate at the first step, the schedule built."""
    args = argparse.Namespace(config=str(config), set=sets)
    trainer = build_trainer(
        ConfigParser.from_args(args), process_info(), torch.device("cpu"), logging.getLogger("t")
    )
    return [group["lr"] for group in trainer.optimizer.param_groups]


@pytest.mark.parametrize(
    ("shipped", "groups"),
    [("config.json", None), ("configs/demo.json", None), ("configs/demo.json", "head")],
)
def test_the_batch_size_lines_scale_every_rate_the_config_trains_with(
    shipped, groups, tmp_path, monkeypatch, capsys, cifar_dir
):
    """The linear rule's --set lines, applied, give every parameter group the rate the larger
    batch asks for: config.json's rates come from OneCycleLR's max_lr, not optimizer.args.lr,
    and a group with a rate of its own (here added to the demo) is scaled too."""
    import tune

    config = without_muon(json.loads((ROOT / shipped).read_text()))
    if shipped == "config.json":  # the fast recipe, tiny, on the generated CIFAR-10 archive
        config["arch"]["args"].update(widths=[8, 16, 16], whiten_samples=40)
        config["data_loader"]["args"].update(
            data_dir=str(cifar_dir), download=False, batch_size=32, validation_split=20
        )
        config["trainer"]["save_dir"] = str(tmp_path / "saved")
    else:
        config = shrink(config, tmp_path / "saved")
    if groups is not None:
        config["optimizer"]["param_groups"] = [{"params": groups, "lr": 0.01}]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    monkeypatch.setattr("base.tuning.largest_batch", lambda trainer, *_: 3 * 32)  # 3 x 32
    assert tune.main(["-c", str(path), "--batch-size", "--max-memory", "100"]) == 0
    sets = re.findall(r"--set (\S+)", capsys.readouterr().out)
    assert sets[0] == "data_loader.args.batch_size=96"
    before, after = group_rates(path, []), group_rates(path, sets)
    assert after == pytest.approx([3 * rate for rate in before])


def rates_over_run(config: Path, sets: list[str]) -> list[list[float]]:
    """Every group's learning rate at every optimizer step (or epoch) of the run, the schedule
    stepped without training (the config with `sets` applied)."""
    args = argparse.Namespace(config=str(config), set=sets)
    parsed = ConfigParser.from_args(args)
    trainer = build_trainer(parsed, process_info(), torch.device("cpu"), logging.getLogger("t"))
    per_step = parsed["lr_scheduler"]["interval"] == "step"
    num_steps = trainer.epochs * (trainer.steps_per_epoch if per_step else 1)
    rates = []
    with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()"
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(num_steps):
            rates.append([group["lr"] for group in trainer.optimizer.param_groups])
            trainer.lr_scheduler.step()
    return rates


# Schedules of every kind of rate: the optimizer's, scaled by a warmup, a group with a rate of
# its own, and those that set the rates themselves (OneCycleLR's peak, CyclicLR's base and peak,
# a base of 0 included).
SCHEDULES = {
    "cosine": {"type": "CosineAnnealingLR", "args": {}, "interval": "epoch"},
    "warmup": {"type": "CosineAnnealingLR", "args": {}, "interval": "step", "warmup_steps": 3},
    "one_cycle": {"type": "OneCycleLR", "args": {"max_lr": [0.02, 0.004]}, "interval": "step"},
    "cyclic": {
        "type": "CyclicLR", "args": {"base_lr": 0.001, "max_lr": 0.01, "step_size_up": 4},
        "interval": "step",
    },
    "cyclic_from_0": {
        "type": "CyclicLR", "args": {"base_lr": [0, 0.0001], "max_lr": [0.01, 0.05],
                                     "step_size_up": 4},
        "interval": "step", "warmup_steps": 2,
    },
}  # fmt: skip


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_the_printed_lines_give_the_suggestion_and_scale_every_rate_of_the_run(
    schedule, tmp_path, monkeypatch, capsys
):
    """The range test's --set line, applied, makes the suggestion the first group's highest
    rate of the run and multiplies every rate of every step alike; the batch size's line
    multiplies them all by the batch's factor. A CyclicLR run reads neither optimizer.args.lr
    (its base_lr replaces it) nor the rate of the first step (its base, maybe 0)."""
    import tune
    from utils.optim.lr_range import RangeTest

    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["optimizer"] = {"type": "SGD", "args": {"lr": 0.003, "momentum": 0.9},
                           "param_groups": [{"params": "head", "lr": 0.01}]}  # fmt: skip
    config["lr_scheduler"] = SCHEDULES[schedule]
    config["trainer"]["tensorboard"] = False
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    before = rates_over_run(path, [])
    suggestion = 0.0123
    lrs = geometric(1e-4, 1.0, 5)  # a curve for the files; the suggestion is what counts here
    monkeypatch.setattr(
        "base.tuning.lr_range_test",
        lambda *_: RangeTest(lrs, [1.0] * 5, [1.0] * 5, "done", suggestion),
    )
    assert tune.main(["-c", str(path), "--lr-range", "--run-id", "lr"]) == 0
    sets = re.findall(r"--set (\S+)", capsys.readouterr().out)
    after = rates_over_run(path, sets)
    assert max(rates[0] for rates in after) == pytest.approx(suggestion, rel=1e-3)
    factor = suggestion / max(rates[0] for rates in before)
    for step_before, step_after in zip(before, after, strict=True):
        assert step_after == pytest.approx([factor * rate for rate in step_before], rel=1e-3)
    monkeypatch.setattr("base.tuning.largest_batch", lambda trainer, *_: 3 * 32)  # 3 x 32
    assert tune.main(["-c", str(path), "--batch-size", "--max-memory", "100"]) == 0
    sets = re.findall(r"--set (\S+)", capsys.readouterr().out)
    assert sets[0] == "data_loader.args.batch_size=96"
    after = rates_over_run(path, sets[1:])
    for step_before, step_after in zip(before, after, strict=True):
        assert step_after == pytest.approx([3 * rate for rate in step_before], rel=1e-3)


def test_a_first_loss_that_is_not_finite_is_one_line_and_writes_nothing(
    tmp_path, monkeypatch, capsys
):
    """A loss that is not finite at the first step (before any update: the data or the model,
    not the learning rate) leaves no curve to draw: one line, exit 1, no folder."""
    import tune

    monkeypatch.setattr("base.tuning.train_step", lambda *_: torch.tensor(float("nan")))
    code = tune.main(["-c", str(demo_config(tmp_path)), "--lr-range", "--run-id", "nan"])
    error = capsys.readouterr().err.strip()
    assert code == 1 and error.startswith("error: ") and "\n" not in error, error
    assert "not finite" in error
    assert not (tmp_path / "saved" / "log" / "Demo_CifarCNN" / "nan").exists()


@pytest.mark.slow  # about 2 s an example; test_tune_py_batch_size_stops_at_the_training_set is fast
@pytest.mark.parametrize("num_examples", [pytest.param(10, id="10-examples")])
def test_the_batch_size_answer_is_at_most_a_pass_of_the_training_samples(
    num_examples, tmp_path, monkeypatch, capsys
):
    """Whatever fits in memory, the loader forms no batch larger than one pass of this
    process's training samples: the answer is at most that many (here every size fits)."""
    import tune

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("the CPU's peak memory is read from Linux's /proc")
    monkeypatch.setattr("base.tuning.train_step", lambda *_: torch.zeros(()))  # fits: any size

    @settings(max_examples=num_examples, deadline=None)
    @given(num_train=st.integers(20, 700), batch_size=st.integers(1, 64),
           max_batch=st.integers(1, 2000))  # fmt: skip
    def check(num_train: int, batch_size: int, max_batch: int) -> None:
        config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
        config["data_loader"]["args"].update(
            num_train=num_train, validation_split=10, batch_size=batch_size
        )
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
        command = ["-c", str(path), "--batch-size", "--max-memory", "100"]
        assert tune.main([*command, "--max-batch", str(max_batch)]) == 0
        output = capsys.readouterr().out
        (size,) = map(int, re.findall(r"--set data_loader.args.batch_size=(\d+)", output))
        assert size == min(max_batch, num_train - 10), output

    check()


def test_tune_py_batch_size_stops_at_the_training_set(tmp_path, capsys):
    """The shrunk demo's 256 training samples, with memory to spare: 256, not --max-batch."""
    import tune

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("the CPU's peak memory is read from Linux's /proc")
    command = ["-c", str(demo_config(tmp_path)), "--batch-size", "--max-memory", "100"]
    assert tune.main([*command, "--max-batch", "1024"]) == 0
    output = capsys.readouterr().out
    assert "--set data_loader.args.batch_size=256" in output and "no larger batch" in output
    assert not (tmp_path / "saved").exists()  # --batch-size writes nothing


@pytest.mark.parametrize("num_examples", [pytest.param(12, id="12-examples")])
def test_the_largest_batch_fits_its_validation_step_too(num_examples, tmp_path, monkeypatch):
    """Validation runs at the same batch size: where its step needs more memory than the
    training step (test-time augmentation's views, a large output), the answer is the largest
    size whose both steps fit. Memory is counted here as each step's samples x its cost."""
    import base.tuning
    from trainer.trainer import Trainer

    config = ConfigParser.from_args(argparse.Namespace(config=str(demo_config(tmp_path))))
    trainer = build_trainer(config, process_info(), torch.device("cpu"), logging.getLogger("t"))
    used, costs = [0], {}

    @contextlib.contextmanager
    def counted_peak(device: torch.device):
        used[0] = 0
        yield lambda: used[0]

    def costing(step: str):
        original = getattr(Trainer, step)

        def counted(self, batch):
            used[0] = max(used[0], costs[step] * len(batch[0]))
            return original(self, [part[:1] for part in batch])  # computed on one: fast

        return counted

    monkeypatch.setattr(base.tuning, "peak_memory", counted_peak)
    for step in ("training_step", "validation_step"):
        monkeypatch.setattr(Trainer, step, costing(step))

    @settings(max_examples=num_examples, deadline=None)
    @given(train_cost=st.integers(1, 8), val_cost=st.integers(1, 8), budget=st.integers(1, 900))
    @example(train_cost=1, val_cost=4, budget=400)  # validation's 4 x: 100, not training's 300
    def check(train_cost: int, val_cost: int, budget: int) -> None:
        costs.update(training_step=train_cost, validation_step=val_cost)
        expected = min(budget // max(train_cost, val_cost), 300)
        assert base.tuning.largest_batch(trainer, budget, 300) == (expected or None)

    check()
    assert trainer.model.training  # as the engine left it


def replay(losses: list[float]) -> Callable[[float], float]:
    """step(lr) for run_range_test: the given losses in turn, whatever the rate."""
    remaining = iter(losses)
    return lambda lr: next(remaining)


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_the_divergence_stop_reads_losses_of_any_sign(num_examples):
    """A loss that keeps falling never diverges, whatever its sign (a Gaussian likelihood's
    loss goes below 0); one that rises from its best by 3 times the best's magnitude does:
    4 times the best, for a positive loss, as documented."""

    @settings(max_examples=num_examples)
    @given(
        start=st.floats(-100, 100),
        drops=st.lists(st.floats(0, 10), min_size=3, max_size=40),
        rise=st.floats(3.5, 10),
    )
    def check(start: float, drops: list[float], rise: float) -> None:
        losses = [start - sum(drops[:i]) for i in range(len(drops))]
        falling = run_range_test(replay(losses), geometric(1e-5, 1.0, len(losses)))
        assert falling.stopped == "done" and falling.losses == losses
        best = min(falling.smoothed)  # what the stop compares with: the smoothed loss
        high = best + rise * abs(best) + 1  # held: the smoothed loss climbs towards it
        rising = [*losses, *[high] * 300]
        assert run_range_test(replay(rising), geometric(1e-5, 1.0, len(rising))).stopped == (
            "diverged"
        )

    check()


def test_a_negative_loss_that_falls_runs_every_step():
    """The case that stopped at the second step: -1, -1.1, ... fell below 4 x -1.1."""
    losses = [-1.0 - 0.1 * i for i in range(20)]
    result = run_range_test(replay(losses), geometric(1e-5, 1.0, 20))
    assert result.stopped == "done" and len(result.lrs) == 20


@pytest.mark.parametrize(
    "flags",
    [
        ["--lr-range", "--min-lr", "1", "--max-lr", "1"],
        ["--lr-range", "--min-lr", "0.1", "--max-lr", "0.01"],
        ["--lr-range", "--max-lr", "inf"],
        ["--lr-range", "--min-lr", "nan"],
        ["--lr-range", "--steps", "2"],
        ["--batch-size", "--max-memory", "nan"],
        ["--batch-size", "--max-memory", "inf"],
        ["--batch-size", "--max-memory", "0"],
        ["--batch-size", "--max-memory", "1", "--max-batch", "0"],
    ],
)
def test_bad_ranges_and_budgets_are_refused_before_anything_runs(flags, tmp_path, capsys):
    """An lr range whose min is not below its max, or a bound or budget that is not a finite
    positive number: argparse's usage and one error line, exit 2, no folder."""
    import tune

    with pytest.raises(SystemExit) as exit_:
        tune.parse_args(["-c", str(tmp_path / "config.json"), *flags])
    error_lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and ": error: --" in error_lines[-1], error_lines
    assert error_lines[0].startswith("usage:") and sum("error" in line for line in error_lines) == 1
    assert not (tmp_path / "saved").exists()


def fitted_state(config_path: Path, tune_first: str | None) -> dict:
    """What a one-epoch run leaves (weights, BatchNorm statistics, EMA, optimizer, GradScaler,
    schedule, every RNG), after `tune_first` ("lr", "batch") in the same process, or without."""
    import random

    import numpy as np

    from base.tuning import largest_batch
    from utils import seed_everything

    config = ConfigParser.from_args(argparse.Namespace(config=str(config_path), run_id="r"))
    seed_everything(config["seed"])
    trainer = build_trainer(config, process_info(), torch.device("cpu"), logging.getLogger("t"))
    trainer.check_first_batch()
    if tune_first == "lr":
        lr_range_test(trainer, geometric(1e-4, 10.0, 8))
    elif tune_first == "batch":
        largest_batch(trainer, 100 * 2**30, 64)  # memory to spare: 32 and 64 tried
    # fit() seeds each epoch itself: the generators are compared before it too.
    numpy_state = np.random.get_state()
    generators = (random.getstate(), numpy_state[1].tobytes(), numpy_state[2:],
                  torch.get_rng_state().tolist())  # fmt: skip
    config.log_dir.mkdir(parents=True)
    config.checkpoint_dir.mkdir(parents=True)
    trainer.fit()
    return {
        "generators": generators,
        "model": trainer.model.state_dict(),
        "ema": trainer.ema.state_dict(),
        "optimizer": repr(trainer.optimizer.state_dict()),
        "scaler": trainer.scaler.state_dict(),
        "schedule": repr(trainer.lr_scheduler.state_dict()),
        "rng": (random.random(), float(np.random.rand()), float(torch.rand(()))),
    }


@pytest.mark.parametrize("tune_first", ["lr", "batch"])
def test_a_run_trained_after_tuning_in_the_same_process_equals_one_without(tune_first, tmp_path):
    """Everything a tuning changes is put back: the run that follows it is bit-identical to a
    run without it (fp16's GradScaler, EMA, accumulation, dropout, BatchNorm, a per-step
    schedule, the data order)."""
    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["arch"]["args"]["dropout"] = 0.2
    config["trainer"].update(epochs=1, tensorboard=False, amp="fp16", ema_decay=0.9,
                             grad_accum_steps=2)  # fmt: skip
    config["lr_scheduler"] = SCHEDULES["one_cycle"] | {"args": {"max_lr": 0.01}}
    paths = {}
    for name in ("plain", "tuned"):
        config["trainer"]["save_dir"] = str(tmp_path / name)
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(config))
    plain, tuned = fitted_state(paths["plain"], None), fitted_state(paths["tuned"], tune_first)
    assert plain["scaler"]  # fp16: the GradScaler is on (a disabled one has no state)
    for part in ("model", "ema"):
        for key, value in plain[part].items():
            assert torch.equal(value, tuned[part][key]), (part, key)
    for part in ("optimizer", "scaler", "schedule", "rng", "generators"):
        assert plain[part] == tuned[part], part


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_no_schedule_moves_the_rates_of_the_range_test(schedule, tmp_path):
    """The test sets every step's rates itself, the groups kept at the ratios of the rates the
    config sets; the schedule is not stepped (its state is as before)."""
    from base.tuning import config_rates

    config = shrink(json.loads((ROOT / "configs/demo.json").read_text()), tmp_path / "saved")
    config["optimizer"] = {"type": "SGD", "args": {"lr": 0.003, "momentum": 0.9},
                           "param_groups": [{"params": "head", "lr": 0.01}]}  # fmt: skip
    config["lr_scheduler"] = SCHEDULES[schedule]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    parsed = ConfigParser.from_args(argparse.Namespace(config=str(path)))
    trainer = build_trainer(parsed, process_info(), torch.device("cpu"), logging.getLogger("t"))
    schedule_state = repr(trainer.lr_scheduler.state_dict())
    peaks, seen = config_rates(trainer), []
    trainer.optimizer.register_step_pre_hook(
        lambda optimizer, *_: seen.append([group["lr"] for group in optimizer.param_groups])
    )
    rates = geometric(1e-4, 1.0, 6)
    lr_range_test(trainer, rates)
    expected = [rate * peak / peaks[0] for rate in rates[: len(seen)] for peak in peaks]
    assert len(seen) >= 3 and [rate for step in seen for rate in step] == pytest.approx(expected)
    assert repr(trainer.lr_scheduler.state_dict()) == schedule_state


def test_not_even_a_batch_of_1_is_one_line_and_exit_2(tmp_path, capsys):
    import tune

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("the CPU's peak memory is read from Linux's /proc")
    command = ["-c", str(demo_config(tmp_path)), "--batch-size", "--max-memory", "0.01"]
    assert tune.main(command) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: not even a batch of 1 fits in 0.01 GiB") and "\n" not in error
    # The CPU's budget holds the whole process: said, or a budget below it reads as a mystery.
    assert "process's peak resident memory" in error, error


@pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("torchmetrics", "pycocotools")),
    reason="the detection extra is not installed (pip install -e '.[detection]'): its mAP",
)
@pytest.mark.parametrize("num_examples", [pytest.param(8, id="8-examples")])
def test_the_batch_size_search_gives_every_image_its_own_targets(
    num_examples, tmp_path, monkeypatch
):
    """A batch of detection (images, a list of one target dict per image) made to any size
    holds as many target dicts as images, each a real sample's: not the first batch's list
    with its boxes stacked over the batches repeated (what a structural tiling made of it)."""
    import base.tuning
    from data_loader.tasks.detection import write_detection
    from trainer.detection import DetectionTrainer

    write_detection(tmp_path / "data", num_train=24, num_test=8, seed=0)
    path = write_shrunk(
        "configs/detection.json", tmp_path / "d.json", tmp_path / "saved",
        **{"data_loader.args.data_dir": str(tmp_path / "data"), "data_loader.args.batch_size": 4,
           "arch.args.width": 4, "trainer.tensorboard": False},
    )  # fmt: skip
    config = ConfigParser.from_args(argparse.Namespace(config=str(path)))
    trainer = build_trainer(config, process_info(), torch.device("cpu"), logging.getLogger("t"))
    real = {
        repr(target["boxes"].tolist()) for _, targets in trainer.train_loader for target in targets
    }
    seen = []

    def counting(step: str):
        original = getattr(DetectionTrainer, step)

        def counted(self, batch):
            images, targets = batch
            seen.append((step, len(images), len(targets)))
            assert all(repr(target["boxes"].tolist()) in real for target in targets) or (
                step == "validation_step"  # the validation images' own boxes
            )
            return original(self, batch)

        return counted

    for step in ("training_step", "validation_step"):
        monkeypatch.setattr(DetectionTrainer, step, counting(step))
    # No budget: memory is not what is checked, and the CPU's measurement costs a gc.collect().
    monkeypatch.setattr(base.tuning, "peak_memory", lambda device: contextlib.nullcontext())

    @settings(max_examples=num_examples, deadline=None)
    @given(limit=st.integers(1, 21))
    def check(limit: int) -> None:
        seen.clear()
        assert base.tuning.largest_batch(trainer, None, limit) == limit  # memory to spare
        assert seen and all(images == targets for _, images, targets in seen), seen

    check()


@pytest.mark.slow  # two torchrun processes and one more, each importing torch (about 40 s)
def test_under_torchrun_the_curve_is_the_loss_of_every_rank_together(tmp_path: Path):
    """Two ranks of 16 give the curve of one process of 32 on the same samples (wine's MLP: no
    BatchNorm, no dropout): each step's loss is averaged over the ranks, and so is the
    suggestion read from it, the same on every rank."""
    config = shrink(json.loads((ROOT / "configs/wine.json").read_text()), tmp_path / "saved")
    config["trainer"]["tensorboard"] = False
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    common = ["tune.py", "-c", str(path), "--lr-range", "--steps", "12", "--min-lr", "1e-4"]
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    ranks = run_script(
        *launch, *common, "--run-id", "two", "--set", "data_loader.args.batch_size=16"
    )
    one = run_script(*common, "--run-id", "one")
    assert ranks.returncode == 0 and one.returncode == 0, ranks.stderr[-3000:] + one.stderr[-3000:]
    curves = {}
    for run in ("two", "one"):
        with (tmp_path / "saved" / "log" / "Wine_MLP" / run / "lr_range.csv").open() as file:
            curves[run] = [(float(row["lr"]), float(row["loss"])) for row in csv.DictReader(file)]
    assert len(curves["two"]) == len(curves["one"]) >= 3
    for (lr_two, loss_two), (lr_one, loss_one) in zip(curves["two"], curves["one"], strict=True):
        assert lr_two == lr_one and loss_two == pytest.approx(loss_one, rel=1e-4)
    assert ranks.stdout.count("Suggested learning rate") == 1  # rank 0's alone


@pytest.mark.parametrize("num_examples", NUM_EXAMPLES)
def test_the_rates_and_the_smoothing_are_the_documented_ones(num_examples):
    """The rates grow geometrically from --min-lr to --max-lr in --steps steps; each point keeps
    the loss of its own rate, and the smoothed loss is the bias-corrected exponential moving
    average with beta 0.98, sum_j 0.98^(i-j) 0.02 loss_j / (1 - 0.98^(i+1))."""

    @settings(max_examples=num_examples)
    @given(
        log_min=st.floats(-9, 0), decades=st.floats(0.5, 9), num_steps=st.integers(3, 200),
        seed=st.integers(0, 2**16),
    )  # fmt: skip
    def check(log_min: float, decades: float, num_steps: int, seed: int) -> None:
        min_lr, max_lr = 10**log_min, 10 ** (log_min + decades)
        rates = geometric(min_lr, max_lr, num_steps)
        assert len(rates) == num_steps and rates[0] == min_lr
        assert rates[-1] == pytest.approx(max_lr, rel=1e-12)
        ratios = [after / before for before, after in itertools.pairwise(rates)]
        assert ratios == pytest.approx([ratios[0]] * len(ratios), rel=1e-9)
        noise = torch.rand(num_steps, generator=torch.Generator().manual_seed(seed)).tolist()
        loss_of = dict(zip(rates, [1 + 0.1 * value for value in noise], strict=True))
        result = run_range_test(loss_of.__getitem__, rates)
        assert result.losses == [loss_of[rate] for rate in result.lrs]  # its own rate's
        for i, smoothed in enumerate(result.smoothed):
            weights = [0.98 ** (i - j) * 0.02 for j in range(i + 1)]
            average = sum(w * loss for w, loss in zip(weights, result.losses, strict=False))
            assert smoothed == pytest.approx(average / (1 - 0.98 ** (i + 1)), rel=1e-9)

    check()


def test_each_point_of_the_curve_is_the_loss_of_the_step_at_its_rate(tmp_path, monkeypatch):
    """Through the engine, with accumulation: the loss recorded at rates[i] is the mean of the
    training_step losses of the batches whose optimizer step ran at rates[i] (not the next
    step's, which shows what rates[i] did)."""
    from trainer.trainer import Trainer

    path = demo_config(tmp_path)
    config = json.loads(path.read_text())
    config["trainer"]["grad_accum_steps"] = 2
    path.write_text(json.dumps(config))
    parsed = ConfigParser.from_args(argparse.Namespace(config=str(path)))
    trainer = build_trainer(parsed, process_info(), torch.device("cpu"), logging.getLogger("t"))
    original, computed = Trainer.training_step, []

    def recorded(self, batch):
        output = original(self, batch)
        computed.append((self.optimizer.param_groups[0]["lr"], float(output.loss.detach())))
        return output

    monkeypatch.setattr(Trainer, "training_step", recorded)
    rates = geometric(1e-4, 10.0, 8)
    result = lr_range_test(trainer, rates)
    assert len(result.lrs) >= 3
    for rate, loss in zip(result.lrs, result.losses, strict=True):
        mine = [value for at, value in computed if at == rate]
        assert len(mine) == 2 and loss == pytest.approx(sum(mine) / 2, rel=1e-6)


@pytest.mark.parametrize("what", ["--lr-range", "--batch-size"])
def test_a_model_with_nothing_to_train_is_one_line_and_exit_2(what, tmp_path, capsys):
    """arch.freeze over every parameter: refused before any step, nothing written."""
    import tune

    path = demo_config(tmp_path)
    config = json.loads(path.read_text())
    config["arch"]["freeze"] = ["features", "head"]
    path.write_text(json.dumps(config))
    assert tune.main(["-c", str(path), what, "--max-memory", "100"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and "\n" not in error and "empty parameter list" in error, (
        error
    )
    assert not (tmp_path / "saved").exists()


def test_a_run_id_naming_a_file_is_one_line_and_the_file_is_kept(tmp_path, capsys):
    """--run-id whose folder is a file (another tool's, a typo): was NotADirectoryError's
    traceback from listing it; now refused in one line, exit 2, the file as it was."""
    import tune

    config = demo_config(tmp_path)
    taken = tmp_path / "saved" / "log" / "Demo_CifarCNN" / "notes"
    taken.parent.mkdir(parents=True)
    taken.write_text("kept")
    code = tune.main(["-c", str(config), "--lr-range", "--steps", "3", "--run-id", "notes"])
    error = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in error and error.endswith("choose another --run-id"), error
    assert taken.read_text() == "kept"


@pytest.mark.parametrize("where", ["save_dir", "experiment"])
def test_an_output_folder_that_cannot_be_made_is_one_line_before_any_work(
    where, tmp_path, monkeypatch, capsys
):
    """trainer.save_dir under a file, or a file where saved/log/<name> goes: one line, exit 2,
    before the model is built (it used to run the whole test, then fail on writing with a
    traceback)."""
    import build
    import tune

    def no_work(*_args, **_kwargs):
        raise AssertionError("the range test started")

    monkeypatch.setattr(build, "build_trainer", no_work)
    config = demo_config(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("kept\n")
    flags = ["--set", f"trainer.save_dir={blocker / 'saved'}"]
    if where == "experiment":
        (tmp_path / "saved" / "log").mkdir(parents=True)
        blocker = tmp_path / "saved" / "log" / "Demo_CifarCNN"
        blocker.write_text("kept\n")
        flags = []
    code = tune.main(["-c", str(config), "--lr-range", "--run-id", "lr", *flags])
    error = capsys.readouterr().err.strip()
    assert code == 2 and error.startswith("error: ") and "\n" not in error, error
    assert "is not a writable folder" in error
    assert blocker.read_text() == "kept\n"


@pytest.mark.parametrize("torn", ["lr_range.csv", "lr_range.png"])
def test_a_crash_while_writing_the_curve_leaves_no_torn_file(torn, tmp_path, monkeypatch):
    """Each file is written atomically (a temporary file renamed onto its name): a crash in the
    middle leaves the file absent, not half written, and no temporary behind."""
    import tune
    from utils.optim.lr_range import RangeTest

    lrs = [1e-3, 1e-2, 1e-1]
    result = RangeTest(lrs, [1.0, 0.5, 0.7], [1.0, 0.6, 0.6], "done", 1e-2)
    if torn == "lr_range.csv":  # a row that cannot be formed, after two that were
        result = RangeTest(lrs, [1.0, 0.5], [1.0, 0.6], "done", 1e-2)
    else:

        def save(self, target, *args, **kwargs) -> None:  # as a full disk would, mid-file
            file = open(target, "wb") if isinstance(target, str | Path) else target  # noqa: SIM115
            file.write(b"\x89PNG\r\n\x1a\n")
            file.flush()
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(Image.Image, "save", save)
    with pytest.raises((OSError, ValueError)):
        tune.save_outputs(result, tmp_path / "out")
    assert not (tmp_path / "out" / torn).exists()
    assert not list((tmp_path / "out").glob(".*.tmp"))


def folder_files(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*")
            if path.is_file()}  # fmt: skip


@pytest.mark.parametrize("first", ["tune", "train"])
def test_tune_and_train_under_one_run_id_never_share_a_folder(first, tmp_path, capsys):
    """tune.py writes into saved/log/<name>/<run id>, the folder a train.py run of that id logs
    into: whichever comes second is refused in one line, and the first one's files stay as
    they were (train.py after tune.py used to write its logs among the curve's files)."""
    import train
    import tune

    config = demo_config(tmp_path)
    log_dir = tmp_path / "saved" / "log" / "Demo_CifarCNN" / "shared"
    commands = {
        "tune": lambda: tune.main(
            ["-c", str(config), "--lr-range", "--steps", "3", "--run-id", "shared"]
        ),
        "train": lambda: train.main(
            ["-c", str(config), "--run-id", "shared", "--set", "trainer.epochs=1"]
        ),
    }
    second = "train" if first == "tune" else "tune"
    assert commands[first]() == 0, capsys.readouterr().err
    before = folder_files(tmp_path / "saved")
    capsys.readouterr()
    assert commands[second]() == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and error.endswith("choose another --run-id"), error
    assert str(log_dir) in error
    assert folder_files(tmp_path / "saved") == before
